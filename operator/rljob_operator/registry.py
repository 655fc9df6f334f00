"""Which jobs have a running controller on this replica, keyed by namespace/name.

The per-job daemon registers its `JobHandle` when it starts and removes it when it stops;
the controller API looks handles up here. No truth lives here that is not also in `status`:
after a restart the daemons re-register from what the cluster holds.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any, Protocol

# True while a controller API verb that writes status runs (its controller call, then its status
# write): what the controller announces meanwhile reaches status through that write, so it is no
# reason to wake the job's daemon for a pass (which would hold the fleet's mutex while the
# trainer's next call waits). Child tasks of the verb see it too; probes started before do not.
VERB_PUBLISHES: ContextVar[bool] = ContextVar("verb_publishes", default=False)


class JobHandle(Protocol):
    namespace: str
    name: str

    @property
    def controller(self) -> Any:
        """The job's InferenceController."""
        ...

    async def publish(self, why: str) -> None:
        """Write the controller's state into the RLJob status (before an API call answers)."""
        ...

    def poke(self) -> None:
        """Wake the job's daemon for an early reconcile pass."""
        ...


class JobRegistry:
    def __init__(self) -> None:
        self._jobs: dict[tuple[str, str], JobHandle] = {}

    def add(self, handle: JobHandle) -> None:
        self._jobs[(handle.namespace, handle.name)] = handle

    def remove(self, handle: JobHandle) -> None:
        if self._jobs.get((handle.namespace, handle.name)) is handle:
            del self._jobs[(handle.namespace, handle.name)]

    def get(self, namespace: str, name: str) -> JobHandle | None:
        return self._jobs.get((namespace, name))

    def __len__(self) -> int:
        return len(self._jobs)

    def __iter__(self) -> Iterator[JobHandle]:
        return iter(list(self._jobs.values()))
