"""The trainer and executor side raise from one root (`rljob_client.errors.RLJobError`), drawn in its docstring."""

from __future__ import annotations

import ast
import builtins
from pathlib import Path

import rljob_client.errors

ROOT = Path(__file__).resolve().parents[2] / "executor_image"
PACKAGES = ("rljob_client", "rollout_executor")
# Exception bases a class may derive from: the built-in ones, the controller's, and the root's own subclasses.
EXCEPTION_BASES = {n for n in dir(builtins) if isinstance(getattr(builtins, n), type)
                   and issubclass(getattr(builtins, n), BaseException)} | {"ControllerError", "EngineError"}


def exception_classes() -> dict[str, list[str]]:
    """Every class of the two packages that derives from an exception: its bases, by name."""
    found: dict[str, list[str]] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.ClassDef):
                    continue
                bases = [b.id for b in node.bases if isinstance(b, ast.Name)]
                if set(bases) & (EXCEPTION_BASES | {"RLJobError"}):
                    found[f"{path.relative_to(ROOT)}:{node.name}"] = bases
    return found


def test_every_exception_of_the_executor_and_trainer_side_derives_from_the_root() -> None:
    classes = exception_classes()
    assert len(classes) > 10, "the scan found the packages' exceptions"
    stray = {where: bases for where, bases in classes.items() if not where.endswith(":RLJobError")
             and "RLJobError" not in bases}
    assert not stray, f"derive these from rljob_client.errors.RLJobError: {stray}"


def test_the_docstring_draws_every_class_of_the_tree() -> None:
    doc = rljob_client.errors.__doc__ or ""
    names = {where.split(":")[1] for where in exception_classes()} - {"RLJobError"}
    missing = {n for n in names if f"── {n} " not in doc}
    assert not missing, f"add them to the tree in rljob_client/errors.py: {sorted(missing)}"
