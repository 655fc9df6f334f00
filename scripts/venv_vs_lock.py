"""Compare the running interpreter's installed distributions with a lock file.

`scripts/venv_vs_lock.py LOCK` exits 1 and prints the differences when the environment is not
exactly the lock (the project's own editable install, pip and setuptools' bootstrap aside);
`--stray` prints only the names installed but not locked, for install-env to remove.
"""

from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path

# The project itself (installed editable, not locked) and the venv's own installer.
UNLOCKED = {"rljob-operator", "pip"}
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def locked(lock: Path) -> dict[str, str]:
    pins = {}
    for line in lock.read_text().splitlines():
        if m := PIN.match(line):
            pins[canonical(m.group(1))] = m.group(2)
    return pins


def installed() -> dict[str, str]:
    return {canonical(d.metadata["Name"]): d.version for d in metadata.distributions()}


def main(argv: list[str]) -> int:
    pins = locked(Path(argv[0]))
    have = {k: v for k, v in installed().items() if k not in UNLOCKED}
    stray = sorted(set(have) - set(pins))
    if "--stray" in argv:
        print(" ".join(stray))
        return 0
    missing = sorted(set(pins) - set(have))
    wrong = sorted(f"{k}=={have[k]} (lock: {pins[k]})" for k in set(pins) & set(have) if have[k] != pins[k])
    for label, names in (("missing", missing), ("not in the lock", stray), ("other version", wrong)):
        if names:
            print(f"{label}: {', '.join(names)}")
    if missing or stray or wrong:
        return 1
    print(f"venv == {argv[0]}: {len(pins)} packages, exact versions")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
