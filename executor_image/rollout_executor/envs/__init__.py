"""Example environments for spec.rollout.function (bundled so that examples run without a custom image)."""
