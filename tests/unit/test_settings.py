import pytest
from pydantic import ValidationError
from rljob_operator.settings import load_settings


def test_namespace_flags_repeat_and_scope_is_namespaced():
    s = load_settings(["--namespace", "a", "-n", "b"], env={})
    assert s.namespaces == ("a", "b") and not s.clusterwide
    assert s.watches("a") and not s.watches("c")
    assert s.effective_lease_namespace == "a"


def test_all_namespaces_is_clusterwide():
    s = load_settings(["--all-namespaces"], env={})
    assert s.clusterwide and s.watches("anything")


def test_a_scope_is_required():
    with pytest.raises(ValidationError, match="--namespace"):
        load_settings([], env={})


def test_flags_win_over_environment():
    env = {"RLJOB_OPERATOR_NAMESPACES": "x,y", "RLJOB_OPERATOR_API_PORT": "1234", "RLJOB_OPERATOR_METRICS_PORT": "99"}
    s = load_settings(["--controller-api-port=4321"], env=env)
    assert s.namespaces == ("x", "y") and s.api_port == 4321 and s.metrics_port == 99


def test_chart_arguments_parse():
    s = load_settings(
        ["--namespace=ns", "--controller-api-port=8080", "--metrics-port=9090", "--lease-name=l",
         "--lease-namespace=ops", "--lease-duration=15", "--log-level=INFO"],
        env={},
    )
    assert (s.api_port, s.metrics_port, s.lease_name, s.effective_lease_namespace) == (8080, 9090, "l", "ops")


def test_renew_deadline_must_be_shorter_than_lease():
    with pytest.raises(ValidationError, match="renew deadline"):
        load_settings(["-n", "a", "--lease-duration=5", "--renew-deadline=5"], env={})


def test_kopf_settings_bound_watches_and_keep_kopf_state_out_of_status():
    import kopf
    from rljob_operator.handlers import FINALIZER, kopf_settings

    ks = kopf_settings(load_settings(["-n", "a", "--watch-server-timeout", "120", "--watch-client-timeout", "150"], env={}))
    assert (ks.watching.server_timeout, ks.watching.client_timeout) == (120, 150.0)
    assert isinstance(ks.watching.server_timeout, int)  # the API server refuses "120.0"
    assert ks.watching.connect_timeout and ks.networking.request_timeout
    assert ks.persistence.finalizer == FINALIZER == "rljob.io/operator"
    assert isinstance(ks.persistence.progress_storage, kopf.AnnotationsProgressStorage)
    assert isinstance(ks.persistence.diffbase_storage, kopf.AnnotationsDiffBaseStorage)
    assert ks.peering.standalone
