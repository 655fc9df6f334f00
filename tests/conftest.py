# The test cluster fixtures (tests/cluster/fixtures.py): `cluster`, `namespace`.
pytest_plugins = [
    "tests.cluster.fixtures", "tests.ci_guard", "tests.fixtures.vllm_server", "tests.fixtures.prometheus",
    "tests.fixtures.process_logs", "pytester",
]
