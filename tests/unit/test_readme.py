"""The README's controller-API tables are the code's tables: a verb or error reason added to
controller_runtime/api without its README row fails here, and so does a row left behind."""

from __future__ import annotations

import re
from pathlib import Path

from controller_runtime.api.verbs import VERBS
from controller_runtime.api.wire_errors import ERRORS

README_PATH = Path(__file__).resolve().parents[2] / "README.md"
README = README_PATH.read_text()


def _section(title: str) -> str:
    start = README.index(title)
    return README[start : README.index("\n## ", start)]


def test_every_error_reason_has_one_readme_row_with_its_status_and_class() -> None:
    rows = re.findall(r"^\| (\d{3}) \| `(\w+)`[^|]*\| `(\w+)`", _section("## Controller API"), re.M)
    documented = {reason: (int(status), cls) for status, reason, cls in rows}
    table = {row.reason: (row.status, row.client.__name__) for row in ERRORS}
    assert len(rows) == len(documented), "a reason is documented twice"
    assert documented == table


def test_every_verb_has_a_readme_row_with_its_method() -> None:
    rows = re.findall(r"^\| `(\w+)` \| (GET|POST)\b", _section("## Controller API"), re.M)
    assert dict(rows) == {name: verb.method for name, verb in VERBS.items()}


def _metric_rows() -> dict[str, tuple[str, tuple[str, ...]]]:
    rows = re.findall(r"^\| `(rljob_\w+)` \| (\w+) \| ([\w, ]*) \|", _section("## Metrics"), re.M)
    documented = {name: (kind, tuple(x.strip() for x in labels.split(",") if x.strip())) for name, kind, labels in rows}
    assert len(rows) == len(documented), "a metric is documented twice"
    return documented


def test_every_exported_metric_has_one_readme_row_with_its_type_and_labels() -> None:
    from rljob_client.trainer import metrics as trainer_metrics
    from rljob_operator import metrics as operator_metrics
    from rollout_executor import metrics as executor_metrics

    specs = [s for m in (operator_metrics, executor_metrics, trainer_metrics) for s in m.SPECS]
    assert _metric_rows() == {s.name: (s.type, s.labels) for s in specs}


def test_every_alert_has_one_readme_row_with_its_severity_and_for() -> None:
    import yaml

    rules = yaml.safe_load((README_PATH.parent / "helm/rljob-operator/files/alerts.yaml").read_text())
    table = {r["alert"]: (r["labels"]["severity"], r["for"]) for g in rules["groups"] for r in g["rules"]}
    rows = re.findall(r"^\| `(RLJob\w+)` \| (\w+) \| (\w+) \|", _section("## Metrics"), re.M)
    assert len(rows) == len(table) and {a: (sev, f) for a, sev, f in rows} == table


def test_every_event_reason_has_a_troubleshooting_entry() -> None:
    """Events are what `kubectl describe rlj` shows: each reason the controller or the operator
    records is explained in the README (the operator's are string literals of `recorder.record`)."""
    from controller_runtime.events import Reason

    operator = Path(__file__).resolve().parents[2] / "operator" / "rljob_operator"
    literal = re.compile(r'recorder\.record\(\s*"(?:Normal|Warning)",\s*"(\w+)"')
    reasons = {v for k, v in vars(Reason).items() if not k.startswith("_")}
    reasons |= {r for path in operator.rglob("*.py") for r in literal.findall(path.read_text())}
    assert {"TTLExpired", "TrainerRecreated", "CellCreated"} <= reasons
    section = _section("## Troubleshooting")
    assert sorted(r for r in reasons if f"`{r}`" not in section) == []
