"""The README's parameter tables, made from the operators' declarations (their ``__init__`` signatures,
``airflow_provider_horovod.parameters``): after a parameter is added or changed, run

    .venv-airflow/bin/python scripts/parameter_tables.py

A unit test (tests/unit/test_parameters.py) fails while README.md holds other tables than these.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
START = "<!-- The parameter tables: made by scripts/parameter_tables.py from the operators' signatures. -->"
END = "<!-- End of the parameter tables. -->"


def tables() -> str:
    """One table per operator, of the parameters it declares itself."""
    from airflow_provider_horovod.operators.horovod import HorovodTrainOperator
    from airflow_provider_horovod.operators.ray import BaseRayJobOperator, RayTaskOperator

    sections = [
        ("`HorovodTrainOperator`, and `@task.horovod` (whose function is the `train_fn`)", HorovodTrainOperator),
        (
            "`RayTaskOperator`, and `@task.ray` (whose function and call give `python_callable`, `op_args`, "
            "`op_kwargs`)",
            RayTaskOperator,
        ),
        ("Both, and every operator of the provider (`BaseRayJobOperator`)", BaseRayJobOperator),
    ]
    return "\n\n".join(f"{title}:\n\n{operator.parameters.markdown()}" for title, operator in sections)


def with_tables(readme: str) -> str:
    """``readme`` with the tables between its two markers made anew."""
    head, start, rest = readme.partition(START)
    _, end, tail = rest.partition(END)
    if not start or not end:
        raise ValueError(f"README.md has no {START!r} ... {END!r} markers")
    return f"{head}{START}\n\n{tables()}\n\n{END}{tail}"


def main() -> int:
    sys.path.insert(0, str(REPO))  # the checkout's operators, not an installed copy
    text = README.read_text()
    made = with_tables(text)
    if made != text:
        README.write_text(made)
        print("README.md: parameter tables made anew")
    return 0


if __name__ == "__main__":
    sys.exit(main())
