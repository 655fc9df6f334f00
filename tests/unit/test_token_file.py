"""The trainer's view of its rotating ServiceAccount token file (rljob_client.token_file)."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

from rljob_client.token_file import TokenFile, expiry


def jwt(exp: float | None) -> str:
    """A token shaped like a ServiceAccount JWT (unsigned: only its claims are read here)."""
    claims = {"sub": "system:serviceaccount:ns:trainer"} | ({"exp": exp} if exp is not None else {})
    body = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    return f"eyJhbGciOiJSUzI1NiJ9.{body}.c2lnbmF0dXJl"


def rotate(path: Path, text: str) -> None:
    """The kubelet's update of a projected token: a new file takes the path in one rename."""
    fresh = path.with_name(path.name + ".new")
    fresh.write_text(text)
    fresh.replace(path)


def test_expiry_reads_the_exp_claim_and_nothing_else() -> None:
    assert expiry(jwt(1_900_000_000)) == 1_900_000_000
    assert expiry(jwt(None)) is None
    assert expiry("not-a-jwt") is None
    assert expiry("a.%%%.c") is None


def test_the_file_is_read_again_only_when_it_was_replaced(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("one\n")
    tokens = TokenFile(path)
    assert [tokens.current() for _ in range(5)] == ["one"] * 5
    assert tokens.reads == 1
    rotate(path, "two\n")
    assert tokens.current() == "two"
    assert tokens.reads == 2


def test_an_expired_token_makes_the_file_be_read_again_even_if_it_looks_unchanged(tmp_path: Path) -> None:
    now = [1_000.0]
    path = tmp_path / "token"
    old, new = jwt(1_100), jwt(5_000)
    assert len(old) == len(new)
    path.write_text(old)
    stamp = path.stat()
    tokens = TokenFile(path, now=lambda: now[0])
    assert tokens.current() == old
    path.write_text(new)  # rewritten in place, size and mtime as before: the stat cannot tell
    os.utime(path, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    assert tokens.current() == old  # not expired yet: no read
    now[0] = 1_100.0
    assert tokens.current() == new
    assert tokens.reads == 2


def test_refresh_says_whether_the_file_held_another_token(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("same")
    tokens = TokenFile(path)
    assert tokens.current() == "same"
    assert tokens.refresh() is False
    rotate(path, "rotated")
    assert tokens.refresh() is True
    assert tokens.current() == "rotated"


def test_a_missing_or_empty_file_gives_no_token(tmp_path: Path) -> None:
    path = tmp_path / "token"
    tokens = TokenFile(path)
    assert tokens.current() is None
    path.write_text("  \n")
    assert tokens.current() is None
    rotate(path, "late")
    assert tokens.current() == "late"
    path.unlink()
    assert tokens.current() is None and tokens.refresh() is False
