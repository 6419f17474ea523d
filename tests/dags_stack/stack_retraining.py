"""The example retraining DAG exactly as users copy it (``dags/horovod_retraining.py``), loaded here
so the stack's dag-processor parses it: the stack test triggers it through the REST API with
``"logical_date": null``, as Airflow 3 allows for manual runs."""

from __future__ import annotations

import importlib.util
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "dags" / "horovod_retraining.py"

# The DAG it defines registers itself with this file (Airflow's auto-registration), so the workers
# parse this file again to run its tasks.
_spec = importlib.util.spec_from_file_location("horovod_retraining_example", EXAMPLE)
assert _spec is not None and _spec.loader is not None
_spec.loader.exec_module(importlib.util.module_from_spec(_spec))
