"""`rljob-operator`'s entry point: the operator's process runs without the `kubernetes` package.

kopf imports `kubernetes.client` at its own import whenever it can (to recognise the client's
model classes, `kopf._cogs.helpers.thirdparty`), and those generated models were 18 MiB of the
operator's RSS in a process that never builds one: the operator talks to the API server through
`kubeconn`. A `None` in `sys.modules` makes every later `import kubernetes` raise ImportError,
which kopf takes as "not installed". The package stays installed for the `rljob` CLI and the
test cluster's agent; only this process goes without it, so this runs before kopf is imported.
"""

from __future__ import annotations

import sys


def keep_kubernetes_out() -> None:
    if "kubernetes" not in sys.modules:
        sys.modules["kubernetes"] = None  # type: ignore[assignment]


def main() -> int:
    keep_kubernetes_out()
    from rljob_operator.main import main as run_main

    return run_main()
