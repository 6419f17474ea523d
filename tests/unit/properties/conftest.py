"""The Hypothesis profile of the property tests: derandomised (the same cases every run, so a failure
reproduces and the suite's time stays the same), a bounded number of cases per property, no deadline
(the machines differ by 2x; a time bound is no property of the code), no example database, and
Hypothesis's own files (a failure's patch) outside the checkout. The run ends with the count of the
properties and of the cases they tried (without ``-n``: workers' counts stay in the workers).

``make test`` runs the full count. ``make check``, the development loop, sets ``AHP_HYPOTHESIS_PROFILE=check``:
the same properties, derandomised too, on a quarter of the cases."""

from __future__ import annotations

import os
import re
import tempfile

from hypothesis import HealthCheck, settings
from hypothesis.configuration import set_hypothesis_home_dir

set_hypothesis_home_dir(os.path.join(tempfile.gettempdir(), "ahp-hypothesis"))
settings.register_profile(
    "ahp",
    max_examples=100,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.register_profile("check", settings.get_profile("ahp"), max_examples=25)
settings.load_profile(os.environ.get("AHP_HYPOTHESIS_PROFILE", "ahp"))

# Hypothesis's statistics of a test (its pytest plugin keeps them on the item), a line per phase.
_RAN = re.compile(r"(\d+) passing, (\d+) failing")
_tried: dict[str, int] = {}


def pytest_runtest_teardown(item):
    stats = getattr(item, "hypothesis_statistics", None)
    if stats:
        _tried[item.nodeid] = sum(int(passing) + int(failing) for passing, failing in _RAN.findall(stats))


def pytest_terminal_summary(terminalreporter):
    if _tried:
        counts = sorted(_tried.values())
        terminalreporter.write_line(
            f"Properties: {len(counts)}, cases tried: {sum(counts)} ({counts[0]} to {counts[-1]} per property)."
        )
