"""The batch wire format the executor writes and the SDK reads (no torch, no Ray)."""
