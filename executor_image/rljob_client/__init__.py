"""The trainer SDK: `job = rljob_client.connect()`, then `job.batches()`, `job.publish_weights()`, `job.report()`.

`rljob_client.job` says what each call does; `rljob_client.weights.export.iter_named_tensors`
streams a (sharded) model's weights. Sub-packages: `weights` (transports), `wire` (the batch
format the executor writes); `trainer` (the reference trainer, a client of this SDK) and `engine`
(code loaded into vLLM) are not part of the SDK distribution.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rljob_client.job import CallOrderError, Job, connect
    from rljob_client.weights.export import iter_named_tensors

__all__ = ["CallOrderError", "Job", "connect", "iter_named_tensors"]


def __getattr__(name: str) -> Any:
    # lazy: the executor imports `rljob_client.wire` and must not load torch through this package
    if name in ("CallOrderError", "Job", "connect"):
        from rljob_client import job

        return getattr(job, name)
    if name == "iter_named_tensors":
        from rljob_client.weights.export import iter_named_tensors

        return iter_named_tensors
    raise AttributeError(f"module 'rljob_client' has no attribute {name!r}")
