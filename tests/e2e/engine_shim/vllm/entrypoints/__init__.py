"""Test-only shim package: see tests/e2e/engine_shim/README.md."""
