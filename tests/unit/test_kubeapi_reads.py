"""Which reads of the operator may come from the API server's watch cache and which must not.

The children resync's drift reads ask for `resourceVersion=0` (served from the watch cache, no
etcd quorum read: ~100 of them a second at steady state with 1,000 RLJobs, bench/RESULTS.md); the
read that confirms kopf's first body of a job stays a quorum read, since its whole point is a
copy no older than the last write (`JobRuntime.confirm_body`)."""

from __future__ import annotations

from typing import Any

from rljob_operator.kubeapi import KubeApi


class _Response:
    status, reason, data = 200, "OK", b"{}"

    def read(self) -> None:
        pass


class QueryRecorder:
    """The two methods of the official client that `KubeApi` uses; records each request's query."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, list[tuple[str, str]]]] = []

    def param_serialize(self, method: str, resource_path: str, query_params: Any, header_params: dict[str, str],
                        body: Any, auth_settings: Any) -> tuple[Any, ...]:  # fmt: skip
        self.requests.append((method, resource_path, list(query_params)))
        return method, resource_path, header_params, body, None

    def call_api(self, method: str, url: str, header_params: dict[str, str], body: Any, post_params: Any,
                 _request_timeout: Any = None) -> _Response:  # fmt: skip
        return _Response()


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
