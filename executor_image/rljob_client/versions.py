"""Ray Client needs the same Ray version and Python minor version on both ends: say so at connect.

Ray's own refusal names neither what to do nor which side is which; `check` fails first, with
both versions and the install line, when the executor's versions are known (RLJOB_EXECUTOR_PYTHON,
RLJOB_EXECUTOR_RAY), and `from_ray_error` rewrites Ray's refusal the same way when they are not.
"""

from __future__ import annotations

import platform
import re
from dataclasses import dataclass

from rljob_client.errors import RLJobError

PYTHON_ENV, RAY_ENV = "RLJOB_EXECUTOR_PYTHON", "RLJOB_EXECUTOR_RAY"


class VersionMismatch(RLJobError, RuntimeError):
    """This trainer's Python or Ray cannot talk to the executor's over Ray Client."""


@dataclass(frozen=True)
class Runtime:
    python: str  # "3.11.9"
    ray: str  # "2.52.1"

    @property
    def python_minor(self) -> str:
        return ".".join(self.python.split(".")[:2])

    @classmethod
    def here(cls) -> Runtime:
        import ray

        return cls(platform.python_version(), str(ray.__version__))


def mismatch(ours: Runtime, theirs: Runtime) -> str | None:
    """The message for an incompatible pair, None when Ray Client accepts it."""
    if ours.python_minor == theirs.python_minor and ours.ray == theirs.ray:
        return None
    return (f"the executor runs Python {theirs.python} with Ray {theirs.ray}; this trainer runs Python {ours.python} "
            f"with Ray {ours.ray}. Ray Client needs the same Ray version and Python minor version on both ends: "
            f"use Python {theirs.python_minor} in the trainer image and `pip install 'ray[client]=={theirs.ray}'`")


def check(ours: Runtime, theirs: Runtime) -> None:
    message = mismatch(ours, theirs)
    if message is not None:
        raise VersionMismatch(message)


def from_env(environ: dict[str, str]) -> Runtime | None:
    """The executor's versions as the operator or local mode put them in the environment, if they did."""
    python, ray = environ.get(PYTHON_ENV), environ.get(RAY_ENV)
    return Runtime(python, ray) if python and ray else None


_RAY_LINE = re.compile(r"Ray:\s*(\S+)")
_PY_LINE = re.compile(r"Python:\s*(\S+)")


def from_ray_error(exc: BaseException, ours: Runtime) -> VersionMismatch | None:
    """Ray's own version refusal (`Version mismatch: The cluster was started with: Ray: .. Python: ..`), rewritten."""
    text = str(exc)
    if "mismatch" not in text.lower():
        return None
    rays, pythons = _RAY_LINE.findall(text), _PY_LINE.findall(text)
    if not rays or not pythons:
        return VersionMismatch(f"Ray Client refused this trainer's versions (Python {ours.python}, Ray {ours.ray}): {text}")
    message = mismatch(ours, Runtime(pythons[0], rays[0]))
    return VersionMismatch(message or text)
