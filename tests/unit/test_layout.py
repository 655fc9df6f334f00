"""Product comments and docstrings say why, never what was measured: figures, benchmark citations and
issue numbers rot in the code and already live in `bench/RESULTS.md` and the commit history."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT_DIRS = ("controller_runtime", "operator", "executor_image")

# What a "why" never needs: a citation of a bench script or result, an issue number, a benchmark's
# population figure ("an N=1,000 ramp"), a profiler's name or a before/after figure ("90 ms -> 4").
NARRATION = re.compile(
    r"\bbench/"
    r"|\bissues? #?\d+"
    r"|\bN ?= ?\d{1,3}(,\d{3})+|\bN ?= ?\d{3,}"
    r"|\bpy-spy\b"
    r"|\b\d+(\.\d+)? ?(GiB|MiB|KiB|ms|us|s) (->|against|before)\b",
    re.IGNORECASE,
)


def _comments(source: str) -> Iterator[tuple[int, str]]:
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string


def _docstrings(source: str) -> Iterator[tuple[int, str]]:
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        body = node.body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            value = body[0].value.value
            if isinstance(value, str):
                for offset, line in enumerate(value.splitlines()):
                    yield body[0].lineno + offset, line


def narration(source: str) -> list[tuple[int, str]]:
    """The (line, text) of every comment or docstring line that matches NARRATION."""
    found = [*_comments(source), *_docstrings(source)]
    return sorted((line, text.strip()) for line, text in found if NARRATION.search(text))


def product_files() -> list[Path]:
    return sorted(path for name in PRODUCT_DIRS for path in (ROOT / name).rglob("*.py"))


def test_no_product_comment_or_docstring_cites_figures_benches_or_issues() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: {text}"
        for path in product_files()
        for line, text in narration(path.read_text(encoding="utf-8"))
    ]
    assert offenders == [], "\n".join(offenders)


def test_the_guard_catches_each_kind_in_comments_and_docstrings_only() -> None:
    source = '''"""Module: see bench/scale_bench.py."""
TIMEOUT_S = 30  # seconds, a plain constant
def f():
    """Cut from 517 patches of an N=1,000 ramp."""
    # issue 13 and issue #42
    return "bench/ in a string literal is code, not prose"
class C:
    """py-spy showed it."""
    def g(self):
        """Leaves the 2 s default alone."""
        # 189.6 MiB against 167.3 MiB, 4.2 s -> 0.4 s
'''
    assert [line for line, _ in narration(source)] == [1, 4, 5, 8, 11]


def test_the_guard_walks_every_product_package() -> None:
    files = {path.relative_to(ROOT).parts[0] for path in product_files()}
    assert files == set(PRODUCT_DIRS)
