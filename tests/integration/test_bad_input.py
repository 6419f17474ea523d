"""Bad input against the real cluster: every bad operator, sensor, trigger, connection and DAG
parameter fails with an error that names the parameter, shows the value (never a secret) and says
the fix, before anything is submitted: the cluster's job list is the same afterwards.

No training starts here: the whole file runs in seconds against the session's local Ray head.
"""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path

import pytest
from unit.operators.test_horovod import BAD_INPUTS
from unit.operators.training_cluster import GOOD_FN

from airflow_provider_horovod.exceptions import (
    HorovodProviderError,
    InvalidParameterError,
    RayConnectionConfigError,
)
from airflow_provider_horovod.operators.horovod import HorovodTrainOperator
from airflow_provider_horovod.sensors.ray import RayJobSensor
from airflow_provider_horovod.triggers.ray import RayJobTrigger
from harness.tasks import FakeTI

pytestmark = pytest.mark.integration

DAGS = Path(__file__).resolve().parents[2] / "dags"
# Distinct values that must never show in an error: a secret that did would end up in task logs.
SECRET = "s3cr3t-" + uuid.uuid4().hex[:8]


@pytest.fixture
def job_list_unchanged(ray_hook):
    """Yields; then checks that the cluster's jobs are exactly what they were: nothing was submitted."""
    before = sorted(j["submission_id"] or j["job_id"] for j in ray_hook.list_jobs())
    yield
    assert sorted(j["submission_id"] or j["job_id"] for j in ray_hook.list_jobs()) == before


def run_id() -> str:
    return f"bad-{uuid.uuid4().hex[:6]}"


def check_message(message: str, *fragments: str, hidden: tuple[str, ...] = ()) -> None:
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    for secret in hidden:
        assert secret not in message, f"a secret shows in {message!r}"


# --- operator ------------------------------------------------------------------------------------

OPERATOR_CASES = BAD_INPUTS + [
    ({"forward_aws_credentials": True}, "forward_aws_credentials", "set aws_conn_id"),
    ({"forward_aws_credentials": "yes"}, "forward_aws_credentials", "True or False"),
    (
        {"forward_aws_credentials": True, "aws_conn_id": "aws_x", "aws_credentials_ttl_seconds": 60},
        "aws_credentials_ttl_seconds",
        "from 900 to",
    ),
    ({"aws_conn_id": "aws_does_not_exist"}, "aws_conn_id", "create it (type aws)"),
    ({"ray_conn_id": ""}, "ray_conn_id", "'ray_default'"),
    ({"ray_conn_id": None}, "ray_conn_id", "'ray_default'"),
    ({"storage_path": 5}, "storage_path", "s3://bucket/prefix"),
    ({"storage_path": "file://"}, "storage_path", "file:///abs/path"),
    ({"storage_path": "file://data/checkpoints"}, "storage_path", "file:///abs/path"),
    (
        {"train_fn": "airflow_provider_horovod.examples.quickstart:trian_func"},
        "train_fn",
        "defines no 'trian_func'; check the name (it has train_func)",
    ),
    ({"datasets": {"train": ""}}, "datasets['train']", "s3://"),
    ({"num_workers": -2}, "num_workers", "1 or more"),
    ({"resources_per_worker": {"CPU": float("inf")}}, "resources_per_worker", "not a number"),
    ({"resources_per_worker": "CPU=2"}, "resources_per_worker", '{"CPU": 1, "GPU": 1}'),
    ({"checkpoint_num_to_keep": 1.5}, "checkpoint_num_to_keep", "whole number"),
    ({"max_failures": "1"}, "max_failures", "-1 (retry without limit)"),
    ({"horovod_env": {"HOROVOD_CYCLE_TIME": {"ms": 1}}}, "horovod_env", "string or a number"),
    ({"horovod_env": "HOROVOD_CYCLE_TIME=1"}, "horovod_env", "give a dict"),
    ({"horovod_nics": [7]}, "horovod_nics", "interface names"),
    ({"poll_interval_seconds": "1"}, "poll_interval_seconds", "greater than 0"),
    ({"pending_timeout_seconds": float("nan")}, "pending_timeout_seconds", "greater than 0"),
    ({"runtime_env": {"env_vars": {"HF_TOKEN": SECRET}}}, "runtime_env", "looks like a secret"),
    ({"runtime_env": {"env_vars": {"MODE": 1}}}, "runtime_env", "must map a string to a string"),
    ({"runtime_env": {"env_vars": ["MODE=1"]}}, "runtime_env", "env_vars must be a dict"),
    ({"runtime_env": {"pips": ["pandas"]}}, "runtime_env", "unknown field 'pips'; Ray's runtime_env fields"),
    ({"runtime_env": {"py_modules": "/tmp"}}, "runtime_env", "py_modules must be a list"),
    ({"runtime_env": {"py_modules": ["/no/such/module"]}}, "runtime_env", "'/no/such/module' is neither"),
    ({"runtime_env": {"working_dir": "/no/such/dir"}}, "runtime_env", "'/no/such/dir' is not a folder here"),
]


def given(kwargs: dict, parameter: str):
    """The value the user gave for `parameter`, as the error should show it."""
    if m := re.fullmatch(r"(\w+)\['(\w+)'\]", parameter):
        return kwargs[m[1]][m[2]]
    value = kwargs.get(parameter)
    if parameter == "runtime_env" and isinstance(value, dict) and isinstance(value.get("env_vars"), dict):
        return {**value, "env_vars": {k: "***" for k in value["env_vars"]}}  # values hidden
    return value


@pytest.mark.parametrize(
    "kwargs, parameter, fix", OPERATOR_CASES, ids=[f"{p}-{i}" for i, (_, p, _) in enumerate(OPERATOR_CASES)]
)
def test_bad_operator_input(ray_cluster, job_list_unchanged, tmp_path, kwargs, parameter, fix):
    op = HorovodTrainOperator(task_id="train", **{"train_fn": GOOD_FN, "storage_path": str(tmp_path), **kwargs})
    with pytest.raises(InvalidParameterError) as err:
        op.execute({"ti": FakeTI(run_id())})
    assert err.value.parameter == parameter
    check_message(
        str(err.value), f"Invalid {parameter}={given(kwargs, parameter)!r}: ", fix, hidden=(SECRET, ray_cluster.token)
    )
    assert op.submission_id is None


# --- connection ----------------------------------------------------------------------------------


def set_connection(monkeypatch, ray_cluster, conn_id="ray_bad", raw: str | None = None, **fields) -> str:
    """Defines connection `conn_id` (AIRFLOW_CONN_<ID>) to the local cluster, with `fields` changed."""
    port = int(ray_cluster.dashboard_url.rsplit(":", 1)[1])
    conn = {
        "conn_type": "ray",
        "host": "127.0.0.1",
        "port": port,
        "schema": "http",
        "password": ray_cluster.token,
        "extra": {"shared_storage": True},
        **fields,
    }
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", raw if raw is not None else json.dumps(conn))
    return conn_id


CONNECTION_CASES = {
    "verify-number": ({"extra": {"verify": 5}}, ["'verify'=5", "true, false or a CA bundle path"]),
    "verify-word": ({"extra": {"verify": "yes"}}, ["'verify'='yes'", "give true, false or the path of a CA bundle"]),
    "verify-missing-file": (
        {"extra": {"verify": "/no/such/ca.pem"}},
        ["'verify'='/no/such/ca.pem'", "path of a CA bundle"],
    ),
    "extra-unknown": (
        {"extra": {"verfy": False}},
        ["unknown extra ['verfy']", "takes 'verify', 'ca_bundle', 'headers'"],
    ),
    "shared_storage-word": ({"extra": {"shared_storage": "yes"}}, ["'shared_storage'='yes'", "true or false"]),
    "extra-not-json": ({"extra": "{verify: true"}, ["extra is not valid JSON", "give a JSON object"]),
    "extra-not-object": ({"extra": "[1, 2]"}, ["extra must be a JSON object, got list", '{"verify": true']),
    "headers-not-json": ({"extra": {"headers": "{not json"}}, ["'headers' is not valid JSON", "give a JSON object"]),
    "headers-list": ({"extra": {"headers": ["X-Team", "ml"]}}, ["'headers' must be a JSON object, got list"]),
    "headers-number": (
        {"extra": {"headers": {"X-Team": 1}}},
        ["'headers' must map strings to strings; header 'X-Team' has a int value", '"X-Team": "ml"'],
    ),
    "headers-line-break": (
        {"extra": {"headers": {"X-Proxy-Auth": f"{SECRET}\r\nX-Injected: 1"}}},
        ["header 'X-Proxy-Auth' has a line break", "remove it"],
    ),
    "runtime_env-not-object": ({"extra": {"runtime_env": "[1, 2]"}}, ["'runtime_env' must be a JSON object"]),
    "runtime_env-secret": (
        {"extra": {"runtime_env": {"env_vars": {"AWS_SECRET_ACCESS_KEY": SECRET}}}},
        ["extra 'runtime_env'=", "'AWS_SECRET_ACCESS_KEY' looks like a secret", "instance role"],
    ),
    "runtime_env-unknown-field": (
        {"extra": {"runtime_env": {"pips": ["pandas"]}}},
        ["extra 'runtime_env'={'pips': ['pandas']}", "unknown field 'pips'"],
    ),
    "schema-ftp": ({"schema": "ftp"}, ["schema 'ftp'", "'http' or 'https'"]),
    "schema-database": ({"schema": "public"}, ["schema 'public'", "'http' or 'https'"]),
    "host-url-ftp": ({"host": "ftp://127.0.0.1"}, ["schema 'ftp'", "'http' or 'https'"]),
    "host-with-space": ({"host": "ray head"}, ["host 'ray head'", "the port in the port field"]),
    "port-too-big": ({"port": 70000}, ["port 70000", "1 to 65535"]),
    "port-negative": ({"port": -1}, ["port -1", "1 to 65535"]),
}


@pytest.mark.parametrize("through", ["operator", "sensor"])
@pytest.mark.parametrize("fields, fragments", CONNECTION_CASES.values(), ids=CONNECTION_CASES.keys())
def test_bad_connection(ray_cluster, job_list_unchanged, tmp_path, monkeypatch, fields, fragments, through):
    conn_id = set_connection(monkeypatch, ray_cluster, **fields)
    if through == "operator":
        task = HorovodTrainOperator(task_id="train", train_fn=GOOD_FN, storage_path=str(tmp_path), ray_conn_id=conn_id)
    else:
        task = RayJobSensor(task_id="wait", submission_id="ahp-some-job-a1", ray_conn_id=conn_id, poke_interval=1)
    with pytest.raises(RayConnectionConfigError) as err:
        task.execute({"ti": FakeTI(run_id())})
    check_message(str(err.value), f"Connection {conn_id!r}", *fragments, hidden=(SECRET, ray_cluster.token))


def test_a_token_with_a_line_break_inside(ray_cluster, job_list_unchanged, tmp_path, monkeypatch):
    token = ray_cluster.token
    conn_id = set_connection(monkeypatch, ray_cluster, password=f"{token[:6]}\n{token[6:]}")
    op = HorovodTrainOperator(task_id="train", train_fn=GOOD_FN, storage_path=str(tmp_path), ray_conn_id=conn_id)
    with pytest.raises(RayConnectionConfigError) as err:
        op.execute({"ti": FakeTI(run_id())})
    # requests would have echoed the whole header, token included; this names the field only.
    check_message(
        str(err.value),
        "'ray_bad'",
        "the password (the Ray auth token)",
        "~/.ray/auth_token",
        hidden=(token[:6], token[6:]),
    )


def test_a_token_pasted_with_its_trailing_newline_works(ray_cluster, monkeypatch):
    from airflow_provider_horovod.hooks.ray import RayHook

    conn_id = set_connection(monkeypatch, ray_cluster, password=ray_cluster.token + "\n")
    assert isinstance(RayHook(ray_conn_id=conn_id).list_jobs(), list)


@pytest.mark.parametrize("conn_id", ["ray_bad", "ray_default"])
@pytest.mark.parametrize(
    "raw, reason",
    [
        ('{"conn_type": "ray", "host": "127.0.0.1", "password": "%s",' % SECRET, "it is not valid JSON"),
        (
            '{"conn_type": "ray", "host": "127.0.0.1", "port": "http", "password": "%s"}' % SECRET,
            "its port 'http' is not a number",
        ),
    ],
    ids=["malformed-json", "port-not-a-number"],
)
def test_an_unreadable_connection_is_not_taken_for_a_missing_one(
    ray_cluster, job_list_unchanged, tmp_path, monkeypatch, conn_id, raw, reason
):
    # For ray_default, "missing" would mean training on an embedded local cluster instead.
    set_connection(monkeypatch, ray_cluster, conn_id, raw=raw)
    op = HorovodTrainOperator(task_id="train", train_fn=GOOD_FN, storage_path=str(tmp_path), ray_conn_id=conn_id)
    with pytest.raises(RayConnectionConfigError) as err:
        op.execute({"ti": FakeTI(run_id())})
    check_message(
        str(err.value),
        f"Connection {conn_id!r} is set in AIRFLOW_CONN_{conn_id.upper()}",
        reason,
        '"conn_type": "ray"',
        hidden=(SECRET,),
    )


@pytest.mark.parametrize("fields", [{"port": 70000}, {"extra": {"verify": "yes"}}], ids=["port", "verify"])
def test_the_trigger_turns_a_bad_connection_into_one_error_event(ray_cluster, job_list_unchanged, monkeypatch, fields):
    import asyncio

    conn_id = set_connection(monkeypatch, ray_cluster, **fields)

    async def events():
        return [e async for e in RayJobTrigger(submission_id="ahp-some-job-a1", ray_conn_id=conn_id).run()]

    (event,) = asyncio.run(events())
    assert event.payload["outcome"] == "error"
    check_message(
        event.payload["message"],
        f"Connection {conn_id!r}",
        "port 70000" if "port" in fields else "'verify'='yes'",
        hidden=(ray_cluster.token,),
    )


def test_a_connection_that_does_not_exist(ray_cluster, job_list_unchanged, tmp_path):
    op = HorovodTrainOperator(task_id="train", train_fn=GOOD_FN, storage_path=str(tmp_path), ray_conn_id="ray_nope")
    with pytest.raises(RayConnectionConfigError) as err:
        op.execute({"ti": FakeTI(run_id())})
    check_message(str(err.value), "'ray_nope' was not found", "outside a task", "Create it (type 'ray')")


@pytest.mark.parametrize("storage", ["tmp", "file", "default"])
def test_local_storage_with_a_cluster_that_does_not_share_it(
    ray_cluster, job_list_unchanged, tmp_path, monkeypatch, storage
):
    """The result record would be written on the Ray nodes, where Airflow cannot read it."""
    conn_id = set_connection(monkeypatch, ray_cluster, "ray_remote", extra={})
    path = {"tmp": str(tmp_path), "file": f"file://{tmp_path}", "default": None}[storage]
    op = HorovodTrainOperator(task_id="train", train_fn=GOOD_FN, storage_path=path, ray_conn_id=conn_id)
    with pytest.raises(InvalidParameterError) as err:
        op.execute({"ti": FakeTI(run_id())})
    assert err.value.parameter == "storage_path"
    check_message(
        str(err.value),
        "not the embedded local one",
        "s3://bucket/prefix",
        "{\"shared_storage\": true} on connection 'ray_remote'",
        hidden=(ray_cluster.token,),
    )


# --- sensor --------------------------------------------------------------------------------------

SENSOR_CASES = [
    ({"submission_id": ""}, "submission_id", "xcom_pull"),
    ({"submission_id": "   "}, "submission_id", "xcom_pull"),
    ({"submission_id": None}, "submission_id", "xcom_pull"),
    ({"submission_id": 42}, "submission_id", "xcom_pull"),
    ({"submission_id": "None"}, "submission_id", "the template rendered None"),
    ({"submission_id": "ahp-x/../../version"}, "submission_id", "no spaces, '/', '?' or '#'"),
    ({"submission_id": "ahp x a1"}, "submission_id", "as the Ray dashboard shows it"),
    ({"ray_conn_id": ""}, "ray_conn_id", "'ray_default'"),
    ({"ray_conn_id": 5}, "ray_conn_id", "'ray_default'"),
    ({"aws_conn_id": "aws_does_not_exist"}, "aws_conn_id", "create it (type aws)"),
    ({"deferrable": "false"}, "deferrable", "True or False"),
    ({"pending_timeout_seconds": 0}, "pending_timeout_seconds", "greater than 0"),
    ({"pending_timeout_seconds": "10m"}, "pending_timeout_seconds", "greater than 0"),
    ({"deferrable": True, "poke_interval": 0.0}, "poke_interval", "seconds greater than 0"),
]


@pytest.mark.parametrize(
    "kwargs, parameter, fix", SENSOR_CASES, ids=[f"{p}-{i}" for i, (_, p, _) in enumerate(SENSOR_CASES)]
)
def test_bad_sensor_input(ray_cluster, job_list_unchanged, kwargs, parameter, fix):
    sensor = RayJobSensor(task_id="wait", **{"submission_id": "ahp-some-job-a1", "poke_interval": 1, **kwargs})
    with pytest.raises(InvalidParameterError) as err:
        sensor.execute({"ti": FakeTI(run_id())})
    assert err.value.parameter == parameter
    check_message(str(err.value), f"Invalid {parameter}={kwargs[parameter]!r}: ", fix)


@pytest.mark.parametrize(
    "kwargs, parameter",
    [
        ({"poke_interval": -1}, "poke_interval"),
        ({"poke_interval": "fast"}, "poke_interval"),
        ({"timeout": -5}, "timeout"),
        ({"timeout": "1h"}, "timeout"),
    ],
)
def test_bad_sensor_timing_fails_when_the_dag_is_parsed(ray_cluster, job_list_unchanged, kwargs, parameter):
    with pytest.raises(InvalidParameterError) as err:
        RayJobSensor(task_id="wait", submission_id="ahp-some-job-a1", **kwargs)
    assert err.value.parameter == parameter
    check_message(str(err.value), f"Invalid {parameter}={kwargs[parameter]!r}: ", "seconds (0 or more)")


def test_sensor_of_a_job_that_does_not_exist(ray_cluster, job_list_unchanged):
    sensor = RayJobSensor(task_id="wait", submission_id="ahp-no-such-job", poke_interval=1, deferrable=False)
    with pytest.raises(HorovodProviderError, match="'ahp-no-such-job' does not exist.*check submission_id"):
        sensor.execute({"ti": FakeTI("bad-sensor")})


# --- trigger (its arguments cross a serialisation boundary: checked at construction) ------------


@pytest.mark.parametrize(
    "kwargs, parameter, value",
    [
        ({"submission_id": ""}, "submission_id", ""),
        ({"submission_id": None}, "submission_id", None),
        ({"submission_id": "x", "policy": {"poll_interval_s": 0}}, "poll_interval_seconds", 0),
        ({"submission_id": "x", "policy": {"poll_interval_s": "fast"}}, "poll_interval_seconds", "fast"),
        ({"submission_id": "x", "policy": {"pending_timeout_s": -1}}, "pending_timeout_seconds", -1),
        ({"submission_id": "x", "policy": {"pending_timeout_s": "10"}}, "pending_timeout_seconds", "10"),
    ],
)
def test_bad_trigger_arguments(ray_cluster, job_list_unchanged, kwargs, parameter, value):
    with pytest.raises(InvalidParameterError) as err:
        RayJobTrigger(**kwargs)
    assert err.value.parameter == parameter
    check_message(str(err.value), f"Invalid {parameter}={value!r}: ", "give")


# --- DAG params ----------------------------------------------------------------------------------


def load_dag(dag_id: str):
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(DAGS / f"{dag_id}.py")).dags[dag_id]


STORAGE_FIX = ("give an absolute path, file:///path or", "s3://bucket/prefix")


@pytest.mark.parametrize(
    "dag_id, param, value, fix",
    [
        ("horovod_quickstart", "storage_path", 5, STORAGE_FIX),
        ("horovod_quickstart", "storage_path", "relative/dir", STORAGE_FIX),
        ("horovod_quickstart", "storage_path", "gs://bucket/x", STORAGE_FIX),
        ("horovod_sensor_example", "storage_path", ["s3://b"], STORAGE_FIX),
        ("horovod_sensor_example", "storage_path", "s3:///no-bucket", STORAGE_FIX),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_bad_dag_params_are_refused_when_the_run_is_triggered(
    ray_cluster, job_list_unchanged, dag_id, param, value, fix
):
    # What Airflow runs on a DAG run's conf before the run exists (trigger, API, `dags test --conf`).
    from airflow.sdk.definitions.param import ParamsDict
    from airflow.sdk.exceptions import ParamValidationError

    params = ParamsDict(load_dag(dag_id).params)
    with pytest.raises(ParamValidationError) as err:
        params.update({param: value})
        params.validate()
    check_message(str(err.value), f"Invalid input for param {param}: {value!r}", *fix)


def test_a_bad_storage_path_that_got_past_the_dag_params_is_refused_by_the_task(ray_cluster, job_list_unchanged):
    # The second line: the task checks the rendered value itself before submitting.
    task = load_dag("horovod_quickstart").get_task("train")
    context = {"params": {"storage_path": "ftp://host/checkpoints"}, "ti": FakeTI(run_id())}
    task.render_template_fields(context)
    with pytest.raises(InvalidParameterError) as err:
        task.execute(context)
    check_message(str(err.value), "Invalid storage_path='ftp://host/checkpoints': ", "scheme 'ftp' is not supported")
