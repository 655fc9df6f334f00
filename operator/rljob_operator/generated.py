"""The command line shared by the generators of committed files (the CRD, the API reference).

Both write a file derived from the pydantic models and can instead `--check` that the
committed copy is current, which is what keeps them from going stale in CI.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path


def generator_main(argv: list[str] | None, *, prog: str, description: str, default: Path, render: Callable[[], str]) -> int:
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--check", action="store_true", help="fail if the file is stale instead of writing it")
    parser.add_argument("--output", type=Path, default=default, help=f"where the file goes (default {default})")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = args.output.read_text() if args.output.exists() else ""
        if current != text:
            print(f"{args.output} is stale; regenerate it with `{prog}`", file=sys.stderr)
            return 1
        return 0
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text)
    print(f"wrote {args.output}")
    return 0
