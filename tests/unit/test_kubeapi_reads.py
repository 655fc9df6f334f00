"""Which reads of the operator may come from the API server's watch cache and which must not.

The children resync's drift reads ask for `resourceVersion=0` (served from the watch cache, no
etcd quorum read: ~100 of them a second at steady state with 1,000 RLJobs, bench/RESULTS.md); the
read that confirms kopf's first body of a job stays a quorum read, since its whole point is a
copy no older than the last write (`JobRuntime.confirm_body`)."""

from __future__ import annotations

from typing import Any

from rljob_operator.kube.connection import Response
from rljob_operator.kube.kubeapi import KubeApi


class QueryRecorder:
    """Stands in for `kube.connection.ApiConnection`; records each request's query."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, list[tuple[str, str]]]] = []

    def request(self, method: str, path: str, query: Any = (), body: Any = None,
                headers: Any = None, timeout: Any = None) -> Response:  # fmt: skip
        self.requests.append((method, path, list(query)))
        return Response(200, "OK", b"{}")

    def close(self) -> None:
        pass


async def test_drift_reads_come_from_the_watch_cache_and_the_confirming_read_does_not() -> None:
    client = QueryRecorder()
    kube = KubeApi(client)  # type: ignore[arg-type]
    try:
        service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "j-engines", "namespace": "ns"}}
        await kube.get_stored(service)
        await kube.get_rljob("ns", "j")
    finally:
        kube.close()
    (drift, confirm) = client.requests
    assert drift == ("GET", "/api/v1/namespaces/ns/services/j-engines", [("resourceVersion", "0")])
    assert confirm[0] == "GET" and confirm[1].endswith("/rljobs/j") and confirm[2] == []
