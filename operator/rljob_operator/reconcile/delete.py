"""What happens when an RLJob goes away, or when this replica stops running its daemon.

Children are deleted by Kubernetes' garbage collector: every object the operator creates
(engine pods, Services, executor Deployment, trainer Job, RayCluster) carries a controller
owner reference to the RLJob. The operator needs no cleanup code of its own and a deletion
completes even while no operator runs.

The one finalizer on an RLJob is kopf's (renamed `rljob.io/operator`): kopf requires it for
daemons so that it can stop the job's daemon before the object disappears. If the operator
is uninstalled first, remove it by hand (`kubectl patch rlj NAME --type=merge -p
'{"metadata":{"finalizers":null}}'`).

`release_job` runs when the daemon stops for any reason (deletion, operator shutdown, lost
leadership): it drops in-memory state only and never touches the cluster, because a
stopping standby must not act and a failover successor continues from `status`.
"""

from __future__ import annotations

import contextlib
import logging

from rljob_operator.metrics import Metrics
from rljob_operator.reconcile.context import JobContext
from rljob_operator.reconcile.engines import EngineFleet

log = logging.getLogger(__name__)


async def release_job(job: JobContext, fleet: EngineFleet, metrics: Metrics) -> None:
    await fleet.stop()
    metrics.forget_job(job.namespace, job.name)
    with contextlib.suppress(Exception):
        await job.recorder.close()
    log.info("job released", extra={"job": job.key})
