"""The eval fleet's cells pinned to spec.inference.eval's checkpoint: when eval may run, and on what.

`evalpin` holds the engine-side procedure (load the checkpoint, verify the version, probe);
this module applies it to the eval cells of a `Fleet`: which cells are ready, which are
already pinned (a reload of a large checkpoint is not free), and marking them Serving at the
pinned version. Eval cells are created, probed and healed by the controller's reconcile like
policy cells; they never join windows, memory operations or the policy's serving set.

An eval point of the policy being trained (spec.rollout.eval) pins the same cells to the
step's exported weights instead (miles V2 pins per eval point), and its result, recorded
here, is status.lastEval.
"""

from __future__ import annotations

from controller_runtime.api.control import RecordEvalRequest
from controller_runtime.api.spec import InferenceSpec
from controller_runtime.api.status import CellState, EvalStatus
from controller_runtime.cells import UPDATABLE
from controller_runtime.clock import iso
from controller_runtime.evalpin import NOT_CONFIGURED, UNHEALTHY, EvalFleet, pin_eval_clients
from controller_runtime.events import Reason
from controller_runtime.fleet import Fleet

S = CellState
LOAD_TIMEOUT_CALLS = 5  # a checkpoint load may take this many ordinary engine-call timeouts


def eval_replicas(spec: InferenceSpec) -> int:
    return spec.eval.replicas if spec.eval is not None else 0


class EvalCells:
    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.last: EvalStatus | None = None  # status.lastEval

    def record(self, point: RecordEvalRequest) -> EvalStatus:
        """Keep an evaluation of the policy as status.lastEval (an older step never replaces a newer one:
        a retried call after a newer eval point must not move the status backwards)."""
        if self.last is not None and point.step < self.last.step:
            return self.last
        self.last = EvalStatus(**point.model_dump(), time=iso(self.fleet.clock.now()))
        self.fleet.record("eval_recorded", step=point.step, reward=point.reward, pass_at_1=point.pass_at_1,
                          weight_version=point.weight_version, fleet=point.fleet)
        return self.last

    async def pin(self, spec: InferenceSpec, checkpoint: str | None = None,
                  weight_version: str | None = None) -> EvalFleet:
        """Pin the eval fleet to `spec.eval`'s checkpoint (or to `checkpoint` as `weight_version`:
        an eval point's weights) and say whether eval may run.

        Loads the checkpoint on eval cells not yet pinned (outside the mutex: a load can take
        minutes), verifies every eval engine reports the version, probes readiness, and marks
        the cells Serving at that version. Plain data out; skip reasons instead of exceptions.
        """
        pin = spec.eval
        if pin is None:
            return EvalFleet([], None, "", False, NOT_CONFIGURED, "spec.inference.eval is not set")
        if checkpoint is not None or weight_version is not None:
            pin = pin.model_copy(update={"checkpoint": checkpoint or pin.checkpoint,
                                         "weight_version": weight_version or checkpoint or pin.weight_version})
        fleet = self.fleet
        async with fleet.mutex:
            cells = fleet.evals()
            ready = [c for c in cells if c.state in UPDATABLE and c.endpoint]
            if len(ready) < pin.replicas:
                return EvalFleet(
                    [c.endpoint for c in ready if c.endpoint], pin.weight_version, pin.checkpoint, False, UNHEALTHY,
                    f"{len(ready)}/{pin.replicas} eval cells ready: "
                    + ", ".join(f"{c.name}={c.state}" for c in cells),
                )
            generations = {c.name: c.generation for c in ready}
            clients = [fleet.client(c) for c in ready]
            pinned = {c.endpoint for c in ready
                      if c.endpoint and c.state is S.Serving and c.weight_version == pin.weight_version}
        answer = await pin_eval_clients(clients, pin.checkpoint, pin.weight_version, skip_load=pinned,
                                        clock=fleet.clock, load_timeout=fleet.call_timeout * LOAD_TIMEOUT_CALLS,
                                        probe_timeout=spec.health_check.timeout_seconds)
        async with fleet.mutex:
            if answer.ok:
                for name, generation in generations.items():
                    cell = fleet.eval_cells.get(name)
                    if cell is not None and cell.generation == generation and cell.state in UPDATABLE:
                        cell.weight_version = pin.weight_version
                        fleet.move(cell, S.Serving, f"pinned to {pin.checkpoint} ({pin.weight_version})")
            fleet.record("eval_pinned", ok=answer.ok, skip_reason=answer.skip_reason, message=answer.message,
                         version=pin.weight_version, checkpoint=pin.checkpoint)
            if not answer.ok:
                fleet.emit(Reason.EvalSkipped, f"{answer.skip_reason}: {answer.message}", warning=True)
        return answer
