"""The locks are the installs: each profile's lock must match pyproject.toml and be what
scripts/install-env and the Dockerfiles install. Offline: nothing here asks a package index."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]


def _lock_inputs():
    spec = importlib.util.spec_from_file_location("lock_inputs", ROOT / "scripts" / "lock_inputs.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["lock_inputs"] = mod
    spec.loader.exec_module(mod)
    return mod


LI = _lock_inputs()
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")


def _pins(lock: Path) -> dict[str, str]:
    return {canonicalize_name(m[1]): m[2] for line in lock.read_text().splitlines() if (m := PIN.match(line))}


def _entries(lock: Path) -> list[str]:
    """One string per locked requirement, continuation lines joined."""
    return [e for e in re.sub(r"\\\n", " ", lock.read_text()).splitlines() if PIN.match(e)]


@pytest.mark.parametrize("profile", LI.PROFILES, ids=lambda p: p.name)
def test_lock_is_not_stale_against_its_inputs(profile) -> None:
    assert profile.lock.exists(), f"{profile.lock.name} is missing: run scripts/lock"
    assert LI.recorded_digest(profile) == LI.digest(profile), (
        f"{profile.lock.relative_to(ROOT)} was resolved from other inputs than today's pyproject.toml/"
        f"requirements: run scripts/lock (see requirements/README.md)"
    )


@pytest.mark.parametrize("profile", LI.PROFILES, ids=lambda p: p.name)
def test_every_direct_requirement_is_pinned_to_a_version_it_allows(profile) -> None:
    pins = _pins(profile.lock)
    reqs = [r for group in LI.pyproject_requirements(profile.extras).values() for r in group]
    reqs += [
        line.strip()
        for f in profile.inputs
        for line in (LI.REQ / f).read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    wrong = []
    for text in reqs:
        req = Requirement(text)
        version = pins.get(canonicalize_name(req.name))
        if version is None or (req.specifier and not req.specifier.contains(version, prereleases=True)):
            wrong.append(f"{text} -> {version}")
    assert wrong == [], f"{profile.lock.name} does not satisfy pyproject.toml: {wrong}"


@pytest.mark.parametrize("profile", LI.PROFILES, ids=lambda p: p.name)
def test_every_pin_is_exact_and_hashed(profile) -> None:
    entries = _entries(profile.lock)
    assert entries, f"{profile.lock.name} pins nothing"
    assert [e.split()[0] for e in entries if "--hash=sha256:" not in e] == []
    excluded = {canonicalize_name(line.strip()) for f in profile.excludes
                for line in (LI.REQ / f).read_text().splitlines() if line.strip() and not line.startswith("#")}
    assert excluded.isdisjoint(_pins(profile.lock)), "excluded packages must not be locked"


def test_images_share_every_version_with_the_tested_venv() -> None:
    dev = _pins(LI.by_name("dev").lock)
    for profile in LI.PROFILES:
        if profile.constrained_by:
            other = {n: (v, dev.get(n)) for n, v in _pins(profile.lock).items() if dev.get(n) != v}
            assert other == {}, f"{profile.lock.name} differs from the tested versions: {other}"


@pytest.mark.parametrize(
    ("installer", "lock"),
    [
        ("scripts/install-env", "requirements/dev.lock"),
        ("Dockerfile", "requirements/operator.lock"),
        ("executor_image/Dockerfile", "requirements/executor.lock"),
        ("images/trainer.Dockerfile", "requirements/trainer.lock"),
        ("images/engine.Dockerfile", "requirements/engine.lock"),
    ],
)
def test_installers_install_from_their_lock_with_hashes(installer: str, lock: str) -> None:
    text = re.sub(r"\\\n", " ", (ROOT / installer).read_text())
    lines = [line for line in text.splitlines() if not line.lstrip().startswith(("#", "PIP="))]
    installs = [line for line in lines if ("pip" in line and " install" in line) or '"${PIP[@]}"' in line]
    from_lock = [line for line in installs if f"-r {lock}" in line]
    assert from_lock and all("--require-hashes" in line for line in from_lock), f"{installer} must install {lock}"
    # Everything else it installs is the project itself, without dependencies.
    others = [line for line in installs if line not in from_lock]
    assert others and all("--no-deps" in line for line in others), others


def test_the_venv_running_the_tests_is_exactly_the_dev_lock() -> None:
    import subprocess

    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "venv_vs_lock.py"), str(LI.by_name("dev").lock)],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 0, f"the venv is not requirements/dev.lock (run scripts/install-env):\n{proc.stdout}"
