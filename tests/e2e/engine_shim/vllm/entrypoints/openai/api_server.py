"""`python -m vllm.entrypoints.openai.api_server ...` -> the e2e stand-in engine (same argv)."""

from tests.e2e.engine_standin import main

if __name__ == "__main__":
    main()
