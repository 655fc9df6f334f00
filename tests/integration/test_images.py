"""The images scripts/build-images built, started by runc as the chart and the operator start
them: the image's own user (numeric, non-root, the uid the pods' securityContext names), a
read-only root where the chart sets one (with the emptyDir /tmp it mounts), the command the
pod spec gives, and the image's ENTRYPOINT on its own as `docker run IMAGE --help` would.

A tier of its own (`RLJOB_TEST_IMAGES=1 pytest -m images tests/integration/test_images.py`, after
`scripts/build-images`); deselected otherwise. Skipped unless run as root with buildah and runc
installed and the image built; each image is skipped on its own, so the operator's can be
checked before torch's images exist.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from rljob_operator.manifests.executor import EXECUTOR_MODULE
from rljob_operator.manifests.podsecurity import NON_ROOT_UID
from rljob_operator.manifests.trainer import TRAINER_MODULE

from controller_runtime.engines import VLLM_MODULE

pytestmark = pytest.mark.images
ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "scripts" / "build-images"


@dataclass(frozen=True)
class Case:
    #: what the pod spec runs (`command` + the args), before `--help`
    command: tuple[str, ...]
    #: the chart's readOnlyRootFilesystem (with an emptyDir at /tmp)
    read_only: bool
    #: a word `--help` prints, so an error page does not pass
    help_mentions: str


CASES = {
    # helm/rljob-operator/templates/deployment.yaml
    "operator": Case(("rljob-operator",), read_only=True, help_mentions="--all-namespaces"),
    # the operator's pod builders (rljob_operator.manifests)
    "executor": Case(("python", "-m", EXECUTOR_MODULE), read_only=False, help_mentions="usage"),
    "trainer": Case(("python", "-m", TRAINER_MODULE), read_only=False, help_mentions="--learning-rate"),
    "engine": Case(("python", "-m", VLLM_MODULE), read_only=False, help_mentions="--worker-extension-cls"),
}


def _run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def buildah() -> list[str]:
    if not (shutil.which("buildah") and shutil.which("runc")):
        pytest.skip("needs Debian's buildah and runc (apt-get install buildah runc)")
    if _run("id", "-u").stdout.strip() != "0":
        pytest.skip("needs root (buildah's storage, runc)")
    flags = _run(str(BUILD), "--buildah-flags", timeout=60)
    assert flags.returncode == 0, flags.stderr
    return ["buildah", *flags.stdout.split()]


def _image(buildah: list[str], image: str) -> tuple[str, dict]:
    ref = _run(str(BUILD), "--image-name", image).stdout.strip() + ":dev"
    proc = _run(*buildah, "inspect", "--type", "image", ref)
    if proc.returncode != 0:
        pytest.skip(f"{ref} is not built: scripts/build-images {image}")
    return ref, json.loads(proc.stdout)["OCIv1"]["config"]


def _runc_spec(rootfs: str, config: dict, args: list[str], case: Case) -> dict:
    """An OCI runtime spec as a kubelet would ask for: the image's env and workdir, the pod's
    user, its command, a read-only root where the chart sets one, no capabilities."""
    uid, _, gid = config["User"].partition(":")
    return {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            "user": {"uid": int(uid), "gid": int(gid or uid)},
            "args": args,
            "env": config.get("Env", []),
            "cwd": config.get("WorkingDir") or "/",
            "capabilities": {k: [] for k in ("bounding", "effective", "permitted", "inheritable", "ambient")},
            "noNewPrivileges": True,
        },
        "root": {"path": rootfs, "readonly": case.read_only},
        "hostname": "image-test",
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
            {"destination": "/dev/shm", "type": "tmpfs", "source": "shm", "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]},
            {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]},
            {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev", "mode=1777", "size=65536k"]},
        ],
        "linux": {"namespaces": [{"type": t} for t in ("pid", "network", "ipc", "uts", "mount")]},
    }


def _start(buildah: list[str], ref: str, config: dict, args: list[str], case: Case, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    ctr = _run(*buildah, "from", "--pull-never", "--quiet", ref).stdout.strip()
    assert ctr, f"buildah from {ref} failed"
    try:
        rootfs = _run(*buildah, "mount", ctr).stdout.strip()
        bundle = tmp_path / f"bundle-{uuid.uuid4().hex[:8]}"
        bundle.mkdir()
        (bundle / "config.json").write_text(json.dumps(_runc_spec(rootfs, config, args, case)))
        name = f"rljob-image-test-{uuid.uuid4().hex[:8]}"
        state = tmp_path / "runc"
        try:
            return _run("runc", "--root", str(state), "run", "--bundle", str(bundle), name, timeout=300)
        finally:
            _run("runc", "--root", str(state), "delete", "--force", name)
    finally:
        _run(*buildah, "umount", ctr)
        _run(*buildah, "rm", ctr)


@pytest.mark.parametrize("image", list(CASES))
def test_image_starts_as_its_pod_runs_it(buildah: list[str], image: str, tmp_path: Path) -> None:
    case = CASES[image]
    ref, config = _image(buildah, image)
    # runAsNonRoot accepts only a numeric non-root USER; the pods' runAsUser is this uid.
    assert config.get("User") == f"{NON_ROOT_UID}:{NON_ROOT_UID}", config.get("User")
    assert config.get("Entrypoint"), "the image needs an ENTRYPOINT"

    as_pod = _start(buildah, ref, config, [*case.command, "--help"], case, tmp_path)
    assert as_pod.returncode == 0, as_pod.stdout[-3000:] + as_pod.stderr[-3000:]
    assert case.help_mentions in as_pod.stdout, as_pod.stdout[-3000:]

    # `docker run IMAGE --help`: the ENTRYPOINT alone is the same program.
    as_image = _start(buildah, ref, config, [*config["Entrypoint"], "--help"], case, tmp_path)
    assert as_image.returncode == 0, as_image.stdout[-3000:] + as_image.stderr[-3000:]
    assert case.help_mentions in as_image.stdout


@pytest.mark.parametrize("image", ["operator", "executor", "trainer"])
def test_image_carries_no_build_tools_or_foreign_stacks(buildah: list[str], image: str, tmp_path: Path) -> None:
    """The final stage has no compiler, and the operator image no torch (it must stay small)."""
    ref, config = _image(buildah, image)
    absent = {"operator": ["torch", "vllm", "ray"], "executor": ["torch", "vllm", "kopf"], "trainer": ["vllm", "kopf"]}[image]
    probe = (
        "import importlib.util, shutil, sys; "
        "found = [m for m in sys.argv[1:] if importlib.util.find_spec(m)]; "
        "found += [t for t in ('gcc', 'cc', 'make') if shutil.which(t)]; "
        "print(' '.join(found)); sys.exit(1 if found else 0)"
    )
    proc = _start(buildah, ref, config, ["python", "-c", probe, *absent], CASES[image], tmp_path)
    assert proc.returncode == 0, f"{ref} carries {proc.stdout.strip()} {proc.stderr[-2000:]}"
