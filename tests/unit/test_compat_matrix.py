"""make compat's page (scripts/compat_matrix.py): the cells it writes from pytest's JUnit XML and the kept results."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("compat_script", REPO / "scripts" / "compat_matrix.py")
compat = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(compat)

XML = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="t" name="test_a_users_bug_fails_the_task_once_with_its_class[auto]"
 time="41.2"><properties><property name="compat" value="legacy"/></properties></testcase>
<testcase classname="t" name="test_a_users_bug_fails_the_task_once_with_its_class[v2]" time="9.0">
 <failure message="AssertionError: one job | two">trace</failure></testcase>
<testcase classname="t" name="test_a_ray_task_returns_its_value" time="3.0">
 <skipped message="not supported: no such thing">skip</skipped></testcase>
</testsuite></testsuites>"""


def test_junit_cases_become_cells(tmp_path):
    path = tmp_path / "checks.xml"
    path.write_text(XML)
    cases = compat.junit(path)
    train = cases[f"{compat.BUG}[auto]"]
    assert train["outcome"] == "pass"
    assert train["properties"] == {"compat": "legacy"}
    assert train["time_s"] == 41.2
    assert compat.cell(train) == "pass (legacy)"
    assert compat.cell(cases[f"{compat.BUG}[v2]"]) == "fail: AssertionError: one job \\| two"
    assert compat.cell(cases["test_a_ray_task_returns_its_value"]) == "not supported: no such thing"
    assert compat.cell(None) == "not run"
    assert compat.junit(tmp_path / "missing.xml") == {}
    refused = {"outcome": "pass", "message": "", "properties": {"compat": "not supported: refused, naming 2.55"}}
    assert compat.cell(refused) == "not supported: refused, naming 2.55 (checked)"


def test_the_page_has_a_row_per_minor_run_and_the_torch_builds(tmp_path):
    path = tmp_path / "checks.xml"
    path.write_text(XML)
    results = {
        "ray": {
            "2.50.1": {
                "version": "2.50.1",
                "probes": {"outcome": "pass"},
                "checks": compat.junit(path),
                "wall_s": 150.0,
                "run_at": "2026-11-26 04:00 UTC",
            }
        },
        "torch": {"3.11:2.1.2": {"outcome": "pass", "compile_s": 150.0, "run_at": "2026-11-26 05:00 UTC"}},
    }
    text = compat.page(results)
    (row,) = [line for line in text.splitlines() if line.startswith("| 2.50.1 |")]
    assert "| 2.50.1 | pass | not run | not run | not run | pass (legacy) | fail: AssertionError" in row
    assert "2026-11-26 04:00 UTC | 2.5 min |" in row
    assert "| 3.11 | 2.1.2 | pass | 2.5 min | 2026-11-26 05:00 UTC |" in text
    assert "| 3.12 | 2.2.2 | not run | | |" in text
    cells = re.split(r"(?<!\\)\|", row)  # an escaped pipe is inside a cell
    assert len(cells) == len(compat.COLUMNS) + 6  # minor, probes, the checks, run at, wall, and both ends
