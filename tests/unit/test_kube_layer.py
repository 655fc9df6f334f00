"""One Kubernetes access layer (`rljob_operator.kube`): no file outside it imports urllib3 or
kopf's private modules, nor opens its own way to the API server; the product code has no second
client (the official `kubernetes` package) either. import-linter checks urllib3 too
(`pyproject.toml`), but it cannot see inside kopf, so this reads every file's imports."""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KUBE = ROOT / "operator" / "rljob_operator" / "kube"
PRODUCT = ("controller_runtime", "operator", "executor_image")
EVERYWHERE = (*PRODUCT, "tests", "bench", "scripts")
ONLY_IN_KUBE = ("urllib3", "kopf._cogs")
TRANSPORT_ATTRIBUTES = ("ssl_context", "authorization")  # what an aiohttp session to the API server needs


def imported(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """Every module a file imports (`import a.b`, `from a.b import c`), with its line."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield node.lineno, node.module
            yield from ((node.lineno, f"{node.module}.{alias.name}") for alias in node.names)


def under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def offences(source: str, banned: tuple[str, ...]) -> list[str]:
    return [f"l.{line} {m}" for line, m in imported(ast.parse(source)) if any(under(m, b) for b in banned)]


def python_files(*tops: str) -> Iterator[Path]:
    for top in tops:
        for path in sorted((ROOT / top).rglob("*.py")):
            if ".venv" not in path.parts and "go" not in path.parts:
                yield path


def test_the_check_sees_every_form_of_import() -> None:
    source = "import urllib3.util\nfrom kopf._cogs.clients import watching\nfrom kopf import _cogs\nimport kopf\n"
    assert offences(source, ONLY_IN_KUBE) == [
        "l.1 urllib3.util", "l.2 kopf._cogs.clients", "l.2 kopf._cogs.clients.watching", "l.3 kopf._cogs"]  # fmt: skip


def test_no_file_outside_the_kube_package_imports_urllib3_or_kopfs_private_modules() -> None:
    found = {
        str(path.relative_to(ROOT)): hits
        for path in python_files(*EVERYWHERE)
        if KUBE not in path.parents and (hits := offences(path.read_text(), ONLY_IN_KUBE))
    }
    assert found == {}


def test_the_product_has_no_second_kubernetes_client_and_no_module_outside_opens_its_own_session() -> None:
    """The operator and the `rljob` CLI go through `rljob_operator.kube`; the official client
    stays for the test cluster's agent and the benchmarks' helpers only."""
    clients = {
        str(path.relative_to(ROOT)): hits
        for path in python_files(*PRODUCT)
        if (hits := offences(path.read_text(), ("kubernetes",)))
    }
    assert clients == {}
    reaching_in = {
        str(path.relative_to(ROOT)): node.attr
        for path in python_files(*PRODUCT)
        if KUBE not in path.parents
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute) and node.attr in TRANSPORT_ATTRIBUTES
    }
    assert reaching_in == {}


def test_import_linter_protects_urllib3_for_the_kube_package() -> None:
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    protected = [c for c in contracts if c["type"] == "protected" and "urllib3" in c["protected_modules"]]
    assert [c["allowed_importers"] for c in protected] == [["rljob_operator.kube"]]
