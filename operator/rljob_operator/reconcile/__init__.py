"""Reconciliation of one RLJob, one module per concern.

- `spec`: make the children exist (Services, executor, trainer, RayCluster).
- `health`: the per-job daemon running the InferenceController (cells, probes, restarts).
- `status`: conditions, phase and printer counts from what was observed.
- `lifecycle`: suspend/resume, finish, TTL after finish.
- `delete`: what happens when the RLJob goes away.
Each step returns a `flow.StepResult` (continue / requeue-after / stop, with a reason).
"""
