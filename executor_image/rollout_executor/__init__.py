"""The RolloutExecutor: generates, scores and batches samples for trainers, behind a Ray actor."""
