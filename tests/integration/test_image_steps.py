"""Replay each Dockerfile's install steps into a fresh venv (no Docker engine exists here).

The build stage's RUN commands run with /opt/rljob replaced by a temporary venv and the repo
root as the build context (the COPY lines keep the repo's relative layout), then the image's
ENTRYPOINT must start (`--help`) and the heavy packages the image must not carry are absent.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

IMAGES = {
    "Dockerfile": {"absent": ["torch", "vllm", "ray"], "present": ["kopf", "kubernetes", "rljob_operator"]},
    "executor_image/Dockerfile": {"absent": ["vllm", "kopf"], "present": ["ray", "rollout_executor", "rljob_client"]},
    "images/trainer.Dockerfile": {"absent": ["vllm", "kopf", "kubernetes"], "present": ["torch", "transformers", "ray", "rljob_client"]},
    "images/engine.Dockerfile": {"absent": ["kopf", "kubernetes"], "present": ["vllm", "torch", "rljob_client"]},
}
#: torch and vLLM with their CUDA runtime: several GiB to unpack per run (minutes each), so they
#: run with the images tier (RLJOB_TEST_IMAGES=1), beside the images they describe
HEAVY = {"images/trainer.Dockerfile", "images/engine.Dockerfile"}


def _joined_lines(text: str) -> list[str]:
    return re.sub(r"\\\n", " ", text).splitlines()


def _build_stage_runs(text: str) -> list[str]:
    lines = _joined_lines(text)
    froms = [i for i, line in enumerate(lines) if re.match(r"^\s*FROM\s", line, re.I)]
    build = lines[froms[0] : froms[-1]]
    return [re.sub(r"^\s*RUN\s+", "", line) for line in build if re.match(r"^\s*RUN\s", line)]


def _entrypoint(text: str) -> list[str]:
    found = [line for line in _joined_lines(text) if re.match(r"^\s*ENTRYPOINT\s", line)]
    assert found, "the image needs an ENTRYPOINT"
    return json.loads(found[-1].split(None, 1)[1])


@pytest.mark.parametrize("dockerfile", [pytest.param(d, marks=[pytest.mark.images] if d in HEAVY else []) for d in IMAGES])
def test_dockerfile_steps_install_into_a_venv(dockerfile: str, tmp_path: Path) -> None:
    text = (ROOT / dockerfile).read_text()
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PATH": f"{venv}/bin:{os.environ['PATH']}"}
    env.pop("VIRTUAL_ENV", None)
    runs = _build_stage_runs(text)
    assert runs, f"{dockerfile} has no RUN steps in its build stage"
    for cmd in runs:
        if re.match(r"python -m venv /opt/rljob", cmd):
            continue
        cmd = cmd.replace("/opt/rljob", str(venv))
        proc = subprocess.run(["bash", "-c", cmd], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, f"RUN {cmd}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"

    entry = _entrypoint(text)
    exe = venv / "bin" / entry[0]
    proc = subprocess.run([str(exe), *entry[1:], "--help"], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr

    spec = IMAGES[dockerfile]
    probe = "import importlib.util,json,sys; print(json.dumps({m: importlib.util.find_spec(m) is not None for m in sys.argv[1:]}))"
    mods = spec["absent"] + spec["present"]
    found = json.loads(subprocess.run([str(venv / "bin" / "python"), "-c", probe, *mods], check=True, capture_output=True, text=True).stdout)
    assert [m for m in spec["present"] if not found[m]] == []
    assert [m for m in spec["absent"] if found[m]] == [], "the image must stay slim"
