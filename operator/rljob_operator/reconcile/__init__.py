"""Reconciliation of one RLJob, one module per concern.

- `job_runtime`: the per-job daemon; runs the steps below in order, then the status writer.
- `lifecycle`: finishing, TTL after finish, suspend/resume (deletes the engine pods).
- `children`: make the children exist (Services, executor, trainer, RayCluster); the trainer's outcome.
- `engines`: the job's InferenceController (cells, probes, restarts) and one pass of it.
- `delete`: what happens when the RLJob goes away, or this replica stops running its daemon.
- `job_status` (pure) and `status_writer`: conditions, phase and printer counts from what was observed.
- `context` and `flow`: what every step takes (the job and its ports) and returns (a `StepResult`:
  continue / requeue-after / stop, with a reason).

A step takes the objects it works on and returns what it saw; only `job_runtime` knows the
order and folds the observations into the status writer's input. The layers (import-linter,
pyproject.toml): job_runtime > lifecycle | delete > children | engines | status_writer >
context | flow | job_status.
"""
