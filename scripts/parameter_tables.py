"""The parameter tables of docs/parameters.md, made from the operators' declarations (their ``__init__`` signatures,
``airflow_provider_horovod.parameters``): after a parameter is added or changed, run

    .venv-airflow/bin/python scripts/parameter_tables.py

A unit test (tests/unit/test_parameters.py) fails while the page holds other tables than these.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "parameters.md"
START = "<!-- The parameter tables: made by scripts/parameter_tables.py from the operators' signatures. -->"
END = "<!-- End of the parameter tables. -->"


def tables() -> str:
    """One table per operator, of the parameters it declares itself."""
    from airflow_provider_horovod.operators.base import BaseRayJobOperator
    from airflow_provider_horovod.operators.horovod import HorovodTrainOperator
    from airflow_provider_horovod.operators.ray import RayTaskOperator
    from airflow_provider_horovod.sensors.ray import RayJobSensor

    sections = [
        ("`HorovodTrainOperator`, and `@task.horovod` (whose function is the `train_fn`)", HorovodTrainOperator),
        (
            "`RayTaskOperator`, and `@task.ray` (whose function and call give `python_callable`, `op_args`, "
            "`op_kwargs`)",
            RayTaskOperator,
        ),
        ("Both, and every operator of the provider (`BaseRayJobOperator`)", BaseRayJobOperator),
        ("`RayJobSensor` (besides Airflow's sensor parameters: `poke_interval`, `timeout`, `mode`)", RayJobSensor),
    ]
    return "\n\n".join(f"{title}:\n\n{operator.parameters.markdown()}" for title, operator in sections)


def with_tables(page: str) -> str:
    """``page`` with the tables between its two markers made anew."""
    head, start, rest = page.partition(START)
    _, end, tail = rest.partition(END)
    if not start or not end:
        raise ValueError(f"docs/parameters.md has no {START!r} ... {END!r} markers")
    return f"{head}{START}\n\n{tables()}\n\n{END}{tail}"


def main() -> int:
    sys.path.insert(0, str(REPO))  # the checkout's operators, not an installed copy
    text = PAGE.read_text()
    made = with_tables(text)
    if made != text:
        PAGE.write_text(made)
        print("docs/parameters.md: parameter tables made anew")
    return 0


if __name__ == "__main__":
    sys.exit(main())
