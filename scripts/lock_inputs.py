"""The install profiles and what each lock is resolved from, in one table.

`scripts/lock` resolves each profile with `uv pip compile` and writes the digest of its inputs
into the lock's header; `tests/unit/test_locks.py` recomputes the digest offline, so a change
to pyproject.toml's dependencies (or to requirements/*.in, overrides, excludes) that was not
followed by `scripts/lock` fails a test instead of drifting silently.
"""

from __future__ import annotations

import hashlib
import json
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REQ = ROOT / "requirements"


@dataclass(frozen=True)
class Profile:
    name: str
    extras: tuple[str, ...]
    #: extra requirement inputs beside pyproject.toml
    inputs: tuple[str, ...] = ()
    overrides: tuple[str, ...] = ()
    excludes: tuple[str, ...] = ()
    #: resolve inside this profile's pins, so a package shared by two images has one version
    constrained_by: str | None = None
    #: where it is installed, for the README and the lock header
    used_by: str = field(default="", compare=False)

    @property
    def lock(self) -> Path:
        return REQ / f"{self.name}.lock"

    def files(self) -> list[Path]:
        return [REQ / f for f in (*self.inputs, *self.overrides, *self.excludes)]


PROFILES = (
    Profile(
        "dev",
        extras=("operator", "executor", "vllm", "test"),
        inputs=("dev.in", "build.in"),
        overrides=("overrides.txt",),
        excludes=("excludes.txt",),
        used_by="scripts/install-env (tests, local mode)",
    ),
    Profile(
        "operator",
        extras=("operator",),
        inputs=("build.in",),
        constrained_by="dev",
        used_by="Dockerfile (the operator image)",
    ),
    Profile(
        "executor",
        extras=("executor",),
        inputs=("build.in",),
        constrained_by="dev",
        used_by="executor_image/Dockerfile (the RolloutExecutor image)",
    ),
    Profile(
        "trainer",
        extras=("executor", "vllm"),
        inputs=("build.in",),
        constrained_by="dev",
        used_by="images/trainer.Dockerfile (the reference trainer image)",
    ),
    Profile(
        "engine",
        extras=("vllm",),
        inputs=("engine.in", "build.in"),
        overrides=("overrides.txt",),
        excludes=("excludes.txt",),
        constrained_by="dev",
        used_by="images/engine.Dockerfile (the vLLM CPU engine image)",
    ),
)


def by_name(name: str) -> Profile:
    return next(p for p in PROFILES if p.name == name)


def pyproject_requirements(extras: tuple[str, ...]) -> dict[str, list[str]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    optional = project.get("optional-dependencies", {})
    return {"": list(project["dependencies"]), **{e: list(optional[e]) for e in extras}}


def digest(profile: Profile) -> str:
    """A digest of everything the resolution depends on; the pins themselves are not inputs."""
    h = hashlib.sha256()
    h.update(json.dumps(pyproject_requirements(profile.extras), sort_keys=True).encode())
    for f in profile.files():
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    if profile.constrained_by:
        h.update(by_name(profile.constrained_by).lock.read_bytes())
    return h.hexdigest()


HEADER = "# inputs-sha256: "


def recorded_digest(profile: Profile) -> str | None:
    for line in profile.lock.read_text().splitlines():
        if line.startswith(HEADER):
            return line[len(HEADER) :].strip()
    return None


def main(argv: list[str]) -> int:
    cmd, *rest = argv
    if cmd == "names":
        print(" ".join(p.name for p in PROFILES))
    elif cmd == "digest":
        print(digest(by_name(rest[0])))
    elif cmd == "args":
        # The uv pip compile arguments of one profile, one per line (paths relative to ROOT).
        p = by_name(rest[0])
        args = ["pyproject.toml", *(f"requirements/{f}" for f in p.inputs)]
        args += [a for e in p.extras for a in ("--extra", e)]
        args += [a for f in p.overrides for a in ("--overrides", f"requirements/{f}")]
        args += [a for f in p.excludes for a in ("--excludes", f"requirements/{f}")]
        if p.constrained_by:
            args += ["--constraints", f"requirements/{p.constrained_by}.lock"]
        print("\n".join(args))
    elif cmd == "used-by":
        print(by_name(rest[0]).used_by)
    else:
        raise SystemExit(f"unknown command {cmd!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
