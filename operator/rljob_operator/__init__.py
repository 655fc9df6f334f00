"""The kopf operator for RLJob: thin adapters around controller_runtime."""
