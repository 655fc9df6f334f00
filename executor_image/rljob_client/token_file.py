"""A bearer token kept in a file that someone else rotates: the pod's projected ServiceAccount token.

A bound ServiceAccount token expires (an hour by default); the kubelet writes a fresh one into
the projected volume before that (at 80% of its lifetime) by swapping a symlink, so the path
stays and its target changes. A client that read the file once at start fails an hour in;
one that reads it on every call pays a file read per call for a value that changes hourly.
`TokenFile` reads it again only when it may have changed:

- the file is another file or was rewritten (its inode, size or mtime moved: what the
  kubelet's swap and any plain rewrite change);
- the token it holds is past its own `exp` claim (a rewrite the stat did not show, e.g. a
  filesystem with coarse mtimes);
- the caller says the server refused it (`refresh()` after a 401), which covers a rewrite
  that kept size and mtime.

The `exp` claim is read without verifying the signature: it only decides when to look at
the file again, never whether the token is good (the API server's TokenReview does that).
"""

from __future__ import annotations

import base64
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

Stamp = tuple[int, int, int, int]  # (device, inode, size, mtime_ns)


def expiry(token: str) -> float | None:
    """The JWT's `exp` (Unix seconds), or None when the token is not a JWT with one."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        payload = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
        exp = payload.get("exp") if isinstance(payload, dict) else None
    except ValueError:
        return None
    return float(exp) if isinstance(exp, int | float) else None


def _stamp(path: Path) -> Stamp | None:
    try:
        st = path.stat()  # follows the kubelet's ..data symlink to the current file
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class TokenFile:
    """The token in `path`, re-read when the file changed, the token expired, or on `refresh()`."""

    def __init__(self, path: str | os.PathLike[str], now: Callable[[], float] = time.time) -> None:
        self.path = Path(path)
        self._now = now
        self._stamp: Stamp | None = None
        self._token: str | None = None
        self._expires: float | None = None
        self.reads = 0  # how often the file was read (tests and debugging)

    def current(self) -> str | None:
        """The token to send now; None when the file is missing or empty."""
        stamp = _stamp(self.path)
        if stamp is None:
            self._stamp, self._token, self._expires = None, None, None
            return None
        expired = self._expires is not None and self._now() >= self._expires
        if stamp != self._stamp or expired:
            self._read(stamp)
        return self._token

    def refresh(self) -> bool:
        """Read the file again whatever its stamp says; True when that gave a different token."""
        before = self._token
        stamp = _stamp(self.path)
        if stamp is None:
            self._stamp, self._token, self._expires = None, None, None
        else:
            self._read(stamp)
        return self._token is not None and self._token != before

    def _read(self, stamp: Stamp) -> None:
        try:
            text = self.path.read_text().strip()
        except OSError:
            text = ""
        self.reads += 1
        self._stamp, self._token = stamp, text or None
        self._expires = expiry(text) if text else None
