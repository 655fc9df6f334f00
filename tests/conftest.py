# The test cluster fixtures (tests/cluster/fixtures.py): `cluster`, `namespace`.
pytest_plugins = [
    "tests.cluster.fixtures", "tests.ci_guard", "tests.fixtures.vllm_server", "tests.fixtures.prometheus",
    "tests.fixtures.process_logs", "pytester",
]


def pytest_collection_modifyitems(config, items):  # type: ignore[no-untyped-def]
    """The `images` tier runs the images `scripts/build-images` built (tens of minutes cold, so not
    in CI's run): deselected, never skipped, unless RLJOB_TEST_IMAGES=1."""
    import os

    if os.environ.get("RLJOB_TEST_IMAGES") == "1":
        return
    kept = [i for i in items if i.get_closest_marker("images") is None]
    if len(kept) != len(items):
        config.hook.pytest_deselected(items=[i for i in items if i.get_closest_marker("images") is not None])
        items[:] = kept
