"""The `rljob-client` distribution builds on its own and carries the SDK only: no vllm, kopf or kubernetes."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = ("vllm", "kopf", "kubernetes")


def test_the_client_wheel_requires_no_engine_or_operator_package(tmp_path: Path) -> None:
    # built from a copy, so the source tree gets no build/ or egg-info
    src = tmp_path / "src"
    shutil.copytree(ROOT / "controller_runtime", src / "controller_runtime",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "executor_image" / "rljob_client", src / "executor_image" / "rljob_client",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "executor_image" / "pyproject.toml", src / "executor_image" / "pyproject.toml")
    out = tmp_path / "wheel"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-cache-dir",
                    "-q", "-w", str(out), str(src / "executor_image")], check=True, timeout=300)
    (wheel,) = out.glob("rljob_client-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        metadata = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    requires = [line.split(":", 1)[1].strip() for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    assert "Name: rljob-client" in metadata
    assert not [r for r in requires if r.split("[")[0].split(";")[0].split(">")[0].split("=")[0].strip() in FORBIDDEN]
    unconditional = {r.split(">")[0].split("[")[0] for r in requires if "extra ==" not in r}
    assert "torch" not in unconditional and {"pydantic", "ray"} <= unconditional
    assert any(r.startswith("torch") and 'extra == "torch"' in r for r in requires)
    assert {"rljob_client/job.py", "rljob_client/weights/export.py", "rljob_client/wire/trainbatch.py",
            "controller_runtime/api/spec.py"} <= set(names)
    assert not [n for n in names if n.startswith(("rljob_client/trainer/", "rljob_client/engine/",
                                                  "rollout_executor/", "rljob_operator/"))]
