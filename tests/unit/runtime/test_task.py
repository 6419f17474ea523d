"""A task job's entrypoint: the payload written by the Airflow side, the function run, its JSON
return value in the attempt's record; a failure's one AHP_ERROR line."""

import json
import os
import sys

import pytest

from airflow_provider_horovod.ids import TaskRun
from airflow_provider_horovod.jobs.request import task_request, write_payload
from airflow_provider_horovod.runtime import task
from airflow_provider_horovod.spec import TaskRecord, TaskSpec


def run_payload(tmp_path, monkeypatch, function, args=(), kwargs=None, files=None):
    spec = TaskSpec(submission_id="ahp-d-t-x-a1", function=function, storage_uri=str(tmp_path / "storage"),
                    args=list(args), kwargs=kwargs or {}, python_version=f"{sys.version_info[0]}.{sys.version_info[1]}")
    request = task_request(spec, files or {}, {}, TaskRun("d", "t", "r"), {"num_cpus": 1})
    parent = tmp_path / "payload"
    write_payload(request, str(parent))
    monkeypatch.syspath_prepend(str(parent))
    return spec, task.main([request.payload_module])


def test_the_function_runs_with_its_arguments_and_its_value_lands_in_the_record(tmp_path, monkeypatch, capsys):
    spec, code = run_payload(tmp_path, monkeypatch, {"import": "json:dumps"}, args=[{"b": 1, "a": 2}],
                             kwargs={"sort_keys": True})
    assert code == 0
    record = TaskRecord.from_json(open(spec.result_uri).read())
    assert record.return_value == '{"a": 2, "b": 1}' and record.attempt == 1
    assert f"result: {spec.result_uri}" in capsys.readouterr().out


def test_a_pickled_function_runs(tmp_path, monkeypatch):
    import cloudpickle

    files = {"function.pkl": cloudpickle.dumps(lambda x: {"twice": 2 * x})}
    spec, code = run_payload(tmp_path, monkeypatch, {"pickle": "function.pkl"}, args=[21], files=files)
    assert code == 0 and TaskRecord.from_json(open(spec.result_uri).read()).return_value == {"twice": 42}


@pytest.mark.parametrize("function, fragment", [
    ({"import": "os:getcwd"}, None),
    ({"import": "builtins:object"}, "returned a object, which XCom cannot hold as JSON"),
    ({"import": "math:sqrt"}, "ValueError: math domain error"),
])
def test_failures_end_the_job_with_one_line_saying_why(tmp_path, monkeypatch, capsys, function, fragment):
    args = [-1] if function["import"] == "math:sqrt" else []
    spec, code = run_payload(tmp_path, monkeypatch, function, args=args)
    out = capsys.readouterr().out
    if fragment is None:
        assert code == 0 and json.loads(open(spec.result_uri).read())["return_value"]
        return
    assert code == 1 and "AHP_ERROR" in out and fragment in out
    assert not os.path.exists(spec.result_uri)  # no record: the Airflow side sees the failure
