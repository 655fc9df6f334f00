"""The README's controller-API tables are the code's tables: a verb or error reason added to
controller_runtime/api without its README row fails here, and so does a row left behind."""

from __future__ import annotations

import re
from pathlib import Path

from controller_runtime.api.verbs import VERBS
from controller_runtime.api.wire_errors import ERRORS

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


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
