"""A script run's plan, Airflow side: which script, what travels with the job, and the bad inputs refused
before anything is submitted. Pure: no cluster."""

import pytest

from airflow_provider_horovod.contract import TaskRun
from airflow_provider_horovod.decorators.horovod import _HorovodScriptDecoratedOperator, apply_command
from airflow_provider_horovod.exceptions import InvalidParameterError
from airflow_provider_horovod.horovodrun import parse_command
from airflow_provider_horovod.operators.horovod import HorovodTrainOperator
from airflow_provider_horovod.plan import training_plan

TASK_RUN = TaskRun("dag", "train", "manual__1", -1)


@pytest.fixture
def dag_folder(tmp_path):
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "train.py").write_text("import helper\n")
    (tmp_path / "scripts" / "helper.py").write_text("")
    return tmp_path


def plan(dag_folder, **kwargs):
    op = HorovodTrainOperator(task_id="train", storage_path="s3://b/p", **kwargs)
    return training_plan(
        TASK_RUN, op.parameters.checked(op), train_call=None, pending_timeout_s=600.0, dag_folder=str(dag_folder)
    )


def test_a_script_next_to_the_dag_travels_as_the_jobs_working_dir(dag_folder):
    job = plan(dag_folder, train_script="scripts/train.py", script_args=["--epochs", "3"])
    assert job.spec.script == {"path": "train.py", "args": ["--epochs", "3"]}
    assert job.runtime_env["working_dir"] == str(dag_folder / "scripts")
    assert job.spec.train_fn == {}


def test_every_ranks_marked_lines_pass_rays_folding_of_like_lines_as_horovodrun_shows_them(dag_folder):
    import re

    from airflow_provider_horovod.contract import SCRIPT_LINE_MARK

    script_env = plan(dag_folder, train_script="scripts/train.py").request(1).runtime_env["env_vars"]
    allowed = script_env["RAY_DEDUP_LOGS_ALLOW_REGEX"]
    for rank, stream in ((0, "stdout"), (13, "stderr")):
        assert re.search(allowed, SCRIPT_LINE_MARK.format(rank=rank, stream=stream) + " epoch 3: loss 0.25")
    assert not re.search(allowed, "epoch 3: loss 0.25 [1]<stdout>:")  # only a line that starts with the mark
    assert (
        "RAY_DEDUP_LOGS_ALLOW_REGEX" not in plan(dag_folder, train_fn="json:dumps").request(1).runtime_env["env_vars"]
    )


def test_a_script_inside_the_users_working_dir_is_named_relative_to_it(dag_folder):
    job = plan(dag_folder, train_script="scripts/train.py", runtime_env={"working_dir": str(dag_folder)})
    assert job.spec.script == {"path": "scripts/train.py", "args": []}
    assert job.runtime_env["working_dir"] == str(dag_folder)


def test_a_script_outside_the_users_working_dir_is_refused(dag_folder, tmp_path_factory):
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    with pytest.raises(InvalidParameterError, match="outside runtime_env's working_dir") as err:
        plan(dag_folder, train_script="scripts/train.py", runtime_env={"working_dir": str(elsewhere)})
    assert err.value.parameter == "train_script"


def test_a_missing_script_is_refused_naming_where_it_was_looked_for(dag_folder):
    with pytest.raises(InvalidParameterError, match="no such file") as err:
        plan(dag_folder, train_script="scripts/tran.py")
    assert str(dag_folder / "scripts" / "tran.py") in str(err.value)


def test_a_module_run_with_dash_m_must_be_importable_here_unless_code_ships(tmp_path):
    with pytest.raises(InvalidParameterError, match="not importable here"):
        plan(None, train_script="-m no_such_package.train")
    job = plan(None, train_script="-m json.tool", script_args=["--help"])
    assert job.spec.script == {"module": "json.tool", "args": ["--help"]}
    (tmp_path / "my_project").mkdir()
    shipped = plan(None, train_script="-m my_project.train", runtime_env={"py_modules": [str(tmp_path / "my_project")]})
    assert shipped.spec.script == {"module": "my_project.train", "args": []}


@pytest.mark.parametrize(
    ("args", "fix"),
    [
        ("--epochs 3", "give a list of strings"),
        (["--epochs", 3], "item 1 is a int"),
        ({"epochs": 3}, "list of strings"),
    ],
)
def test_script_args_that_are_not_strings_are_refused_naming_the_parameter(dag_folder, args, fix):
    with pytest.raises(InvalidParameterError, match=fix) as err:
        plan(dag_folder, train_script="scripts/train.py", script_args=args)
    assert err.value.parameter == "script_args"


def test_a_function_and_a_script_together_or_neither_are_refused(dag_folder):
    with pytest.raises(InvalidParameterError, match="one of them"):
        plan(dag_folder, train_fn="json:dumps", train_script="scripts/train.py")
    with pytest.raises(InvalidParameterError, match="one of them"):
        plan(dag_folder)


def test_the_taskflow_command_sets_the_script_its_arguments_and_the_flags_parameters():
    op = _HorovodScriptDecoratedOperator(task_id="t", python_callable=lambda: None, horovod_timeout_s=30)
    apply_command(op, parse_command("horovodrun -np 4 --gloo-timeout-seconds 90 python train.py --epochs 9"))
    assert op.train_script == "train.py"
    assert op.script_args == ["--epochs", "9"]
    assert op.num_workers == 4
    assert op.horovod_timeout_s == 90


def test_a_flag_and_a_parameter_that_disagree_are_refused():
    op = _HorovodScriptDecoratedOperator(task_id="t", python_callable=lambda: None, num_workers=3)
    with pytest.raises(InvalidParameterError, match="the command line sets it to 4") as err:
        apply_command(op, parse_command("horovodrun -np 4 python train.py"))
    assert err.value.parameter == "num_workers"


def test_horovod_env_from_flags_merges_with_the_parameters():
    op = _HorovodScriptDecoratedOperator(
        task_id="t", python_callable=lambda: None, horovod_env={"HOROVOD_CYCLE_TIME": "5"}
    )
    apply_command(op, parse_command("horovodrun -np 2 --autotune python -m my_project.train"))
    assert op.horovod_env == {"HOROVOD_CYCLE_TIME": "5", "HOROVOD_AUTOTUNE": "1"}
    assert op.train_script == "-m my_project.train"
