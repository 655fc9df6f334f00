"""Code loaded into the engine processes (the vLLM worker extension); never imported by the trainer SDK."""
