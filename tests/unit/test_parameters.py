"""A parameter declared once, in an operator's signature with its Param: what is read from it (name,
type as written, default, templated, renderer, check, doc, attribute), what is made of it (template
fields composed with the base's, attributes, checked values, the docstring, the tables of
docs/parameters.md), and that Airflow and that page agree with it."""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import pytest
from airflow.sdk import DAG

from airflow_provider_horovod import checks
from airflow_provider_horovod.exceptions import InvalidParameterError
from airflow_provider_horovod.operators.base import BaseRayJobOperator
from airflow_provider_horovod.operators.horovod import HorovodTrainOperator
from airflow_provider_horovod.operators.ray import RayTaskOperator
from airflow_provider_horovod.parameters import REQUIRED, Declaration, Param

REPO = Path(__file__).resolve().parents[2]


class Base:
    def __init__(
        self,
        *,
        conn_id: Annotated[str, Param("The connection.", templated=True)] = "default",
        flag: Annotated[bool, Param("A switch.", check=checks.check_bool)] = False,
        **kwargs: Any,
    ) -> None:
        self.parameters.store(self, locals())

    parameters = Declaration.of(__init__)


class Own(Base):
    def __init__(
        self,
        *,
        fn: Annotated[str, Param("What runs; | splits no cell.")],
        workers: Annotated[
            int | Sequence[int] | str,
            Param("How many.", templated=True, renderer="json", check=functools.partial(checks.check_positive)),
        ] = 2,
        resources: Annotated[dict[str, float] | None, Param("Its own.", attribute="own_resources")] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.parameters.store(self, locals())

    parameters = Declaration.of(__init__, base=Base.parameters)


def test_each_parameter_is_read_from_the_signature_and_its_param():
    fn, workers, resources = Own.parameters.own
    assert (fn.name, fn.type, fn.default, fn.required) == ("fn", "str", REQUIRED, True)
    assert (workers.name, workers.type, workers.default, workers.param.renderer) == (
        "workers",
        "int | Sequence[int] | str",
        2,
        "json",
    )
    assert (resources.attribute, resources.type) == ("own_resources", "dict[str, float] | None")
    assert Own.parameters.names == ("conn_id", "flag", "fn", "workers", "resources")  # the base's first
    assert Own.parameters["flag"].param.check is checks.check_bool


def test_template_fields_are_the_templated_parameters_of_the_operator_and_its_base():
    assert set(Own.parameters.template_fields) == {"workers", "conn_id"}
    assert Own.parameters.template_fields_renderers == {"workers": "json"}


def test_a_parameter_without_a_param_is_refused_where_the_class_is_made():
    def __init__(self, *, declared: Annotated[int, Param("x")] = 1, bare: int = 2, **kwargs: Any) -> None:
        pass

    with pytest.raises(TypeError, match="parameter 'bare' is declared without a Param"):
        Declaration.of(__init__)


def test_values_are_kept_as_given_and_checked_only_when_asked():
    made = Own(fn="m:f", workers="{{ params.n }}", resources={"x": 1.0}, flag="yes")
    assert (made.fn, made.workers, made.own_resources, made.conn_id, made.flag) == (
        "m:f",
        "{{ params.n }}",
        {"x": 1.0},
        "default",
        "yes",
    )
    with pytest.raises(InvalidParameterError) as err:
        Own.parameters.checked(made)
    assert err.value.parameter == "flag"
    made.flag, made.workers = True, 3
    # Each through its own check; one without a check as it is, for the plan.
    assert Own.parameters.checked(made) == {
        "conn_id": "default",
        "flag": True,
        "fn": "m:f",
        "workers": 3,
        "resources": {"x": 1.0},
    }


def test_the_docstring_and_the_table_say_each_parameter_once():
    doc = Own.parameters.docstring("An operator.\n\n    It runs.")
    assert doc.startswith("An operator.\n\nIt runs.\n\n:param fn: What runs; | splits no cell.\n")
    assert ":param workers: How many. Templated. Default: ``2``." in doc
    assert ":param flag:" not in doc
    table = Own.parameters.markdown().splitlines()
    assert table[0] == "| parameter | type | default | templated | what it does |"
    assert table[2] == "| `fn` | `str` | required |  | What runs; \\| splits no cell. |"
    assert table[3] == "| `workers` | `int \\| Sequence[int] \\| str` | `2` | yes | How many. |"


def test_the_operators_compose_the_shared_parameters():
    shared = BaseRayJobOperator.parameters.names
    for operator in (HorovodTrainOperator, RayTaskOperator):
        assert operator.parameters.names[: len(shared)] == shared
        assert set(BaseRayJobOperator.template_fields) <= set(operator.template_fields)
    assert RayTaskOperator.parameters["resources"].attribute == "ray_resources"  # BaseOperator has `resources`
    assert ":param num_workers:" in (HorovodTrainOperator.__doc__ or "")


@pytest.mark.filterwarnings("ignore:Task 'typo' was never mapped")
def test_airflow_maps_over_declared_parameters_and_refuses_others():
    with DAG("dag", schedule=None):
        mapped = HorovodTrainOperator.partial(task_id="sweep", train_fn="m:f").expand(num_workers=[1, 2])
        assert mapped.partial_kwargs["train_fn"] == "m:f"
        with pytest.raises(TypeError, match="unexpected keyword argument 'num_worker'"):
            HorovodTrainOperator.partial(task_id="typo", train_fn="m:f").expand(num_worker=[1, 2])


def test_default_args_reach_declared_parameters():
    with DAG("dag", schedule=None, default_args={"ray_conn_id": "ray_prod", "storage_path": "s3://b/p"}):
        op = HorovodTrainOperator(task_id="train", train_fn="m:f")
    assert (op.ray_conn_id, op.storage_path) == ("ray_prod", "s3://b/p")


def test_the_parameters_pages_tables_are_those_of_the_declarations():
    spec = importlib.util.spec_from_file_location("parameter_tables", REPO / "scripts" / "parameter_tables.py")
    assert spec is not None
    assert spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    page = (REPO / "docs" / "parameters.md").read_text()
    assert script.with_tables(page) == page, "docs/parameters.md is stale: run scripts/parameter_tables.py"
    for name in HorovodTrainOperator.parameters.names + RayTaskOperator.parameters.names:
        assert f"| `{name}` |" in page


def test_every_parameters_doc_is_at_most_three_lines_where_it_is_declared():
    import ast
    from pathlib import Path

    package = Path(__file__).resolve().parents[2] / "airflow_provider_horovod"
    long = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Param" and node.args:
                doc = node.args[0]
                if doc.end_lineno - doc.lineno + 1 > 3:
                    long.append(f"{path.relative_to(package.parent)}:{doc.lineno}")
    assert long == [], "Param docs over three lines (the rest belongs in docs/)"
