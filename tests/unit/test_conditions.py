from rljob_operator.conditions import Want, find, is_true, merge_conditions, transitions

T0 = "2026-01-01T00:00:00Z"
T1 = "2026-01-01T00:01:00Z"


def test_new_condition_gets_transition_time_and_generation():
    out = merge_conditions([], [Want("Ready", False, "EnginesStarting", "0/4")], T0, generation=3)
    assert out == [
        {"type": "Ready", "status": "False", "reason": "EnginesStarting", "message": "0/4", "lastTransitionTime": T0, "observedGeneration": 3}
    ]


def test_transition_time_kept_while_status_unchanged_even_if_reason_changes():
    first = merge_conditions([], [Want("Ready", False, "EnginesStarting", "0/4")], T0)
    second = merge_conditions(first, [Want("Ready", False, "EnginesPendingWeights", "0/4")], T1)
    assert second[0]["lastTransitionTime"] == T0
    assert second[0]["reason"] == "EnginesPendingWeights"


def test_transition_time_bumped_when_status_flips():
    first = merge_conditions([], [Want("Ready", False, "EnginesStarting")], T0)
    second = merge_conditions(first, [Want("Ready", True, "AllEnginesServing")], T1)
    assert second[0]["lastTransitionTime"] == T1 and second[0]["status"] == "True"


def test_unknown_status_and_untouched_conditions_are_kept_in_stable_order():
    current = [{"type": "Custom", "status": "True", "reason": "X", "lastTransitionTime": T0}]
    out = merge_conditions(current, [Want("Failed", None, "Unknown"), Want("Ready", True, "Ok")], T1)
    assert [c["type"] for c in out] == ["Ready", "Failed", "Custom"]
    assert find(out, "Failed")["status"] == "Unknown"
    assert is_true(out, "Ready") and not is_true(out, "Failed")


def test_transitions_lists_changed_status_or_reason_only():
    before = merge_conditions([], [Want("Ready", False, "A"), Want("Suspended", False, "NotSuspended")], T0)
    after = merge_conditions(before, [Want("Ready", True, "B"), Want("Suspended", False, "NotSuspended", "msg")], T1)
    assert [c["type"] for c in transitions(before, after)] == ["Ready"]
