"""The example retraining DAG as users copy it (``dags/horovod_retraining.py``), loaded here so the
stack's dag-processor parses it: the stack test triggers it through the REST API with
``"logical_date": null``, as Airflow 3 allows for manual runs. Its ``@daily`` schedule alone is set
aside: unpausing a scheduled DAG starts the latest day's run at once, a whole retraining beside the
tests that no test looks at (on 2 cores, a minute of CPU they need)."""

from __future__ import annotations

import types
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "dags" / "horovod_retraining.py"
SCHEDULE = 'schedule="@daily",'

# The DAG it defines registers itself with this file (Airflow's auto-registration), so the workers
# parse this file again to run its tasks.
_source = EXAMPLE.read_text()
assert SCHEDULE in _source, f"{EXAMPLE} no longer says {SCHEDULE}: update this file"
_module = types.ModuleType("horovod_retraining_example")
_module.__file__ = str(EXAMPLE)
exec(compile(_source.replace(SCHEDULE, "schedule=None,"), str(EXAMPLE), "exec"), _module.__dict__)
