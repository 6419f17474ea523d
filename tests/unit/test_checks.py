"""The parameter checks, one by one: the value they return, and for bad values an
InvalidParameterError naming the parameter, the value and the fix (never a secret's value). Here the
numbers, choices, dicts, ids, connections, tags and prices; the checks of where the data is in
test_checks_data.py, of runtime_env in test_checks_runtime_env.py, of MLflow in test_checks_mlflow.py.

The operator-level table of bad inputs (BAD_INPUTS) lives in ``unit.operators.test_horovod``."""

import math
from datetime import timedelta

import pytest

from airflow_provider_horovod import checks
from airflow_provider_horovod.documents import TrainingSpec
from airflow_provider_horovod.exceptions import InvalidParameterError

SECRET = "s3cr3t-value-0123"


def fails(fn, *args, parameter=None, fix="", **kwargs) -> InvalidParameterError:
    with pytest.raises(InvalidParameterError) as err:
        fn(*args, **kwargs)
    if parameter is not None:
        assert err.value.parameter == parameter
    assert fix in str(err.value), str(err.value)
    assert str(err.value).startswith(f"Invalid {err.value.parameter}={err.value.value!r}: ")
    return err.value


# --- numbers and choices --------------------------------------------------------------------------


def test_num_workers():
    assert checks.check_num_workers(1) == 1
    for bad in (0, -2, "two", True, 2.0, None):
        fails(checks.check_num_workers, bad, parameter="num_workers", fix="1 or more")


@pytest.mark.parametrize(
    "given, checked",
    [((2, 4), [2, 4]), ([1, 8], [1, 8]), ("[2, 4]", [2, 4]), ("4", 4), ([3, 3], 3)],
    ids=["tuple", "list", "rendered-list", "rendered-int", "min-is-max"],
)
def test_num_workers_elastic_range(given, checked):
    assert checks.check_num_workers(given) == checked


@pytest.mark.parametrize(
    "bad, fix",
    [
        ((0, 4), "min 0 must be at least 1"),
        ((4, 2), "at most max 2"),
        ((2.0, 4), "whole numbers"),
        ([2, 3, 4], "[min, max]"),
        ((2, True), "[min, max]"),
        ("[2, 4", "[min, max]"),
        ([], "[min, max]"),
    ],
)
def test_num_workers_bad_ranges_name_the_parameter(bad, fix):
    fails(checks.check_num_workers, bad, parameter="num_workers", fix=fix)


def test_num_workers_range_only_on_train_v2():
    assert checks.check_num_workers([2, 4], trainer_api="v2") == [2, 4]
    assert checks.check_num_workers(4, trainer_api="legacy") == 4
    fails(checks.check_num_workers, (2, 4), trainer_api="legacy", parameter="num_workers", fix="'auto' or 'v2'")


def test_elastic_workers_need_ray_2_55_numbers_any_ray():
    elastic, fixed = TrainingSpec(submission_id="s", storage_uri="/x", num_workers=[2, 4]), TrainingSpec("s", "/x")
    checks.check_ray_features("2.55.0", elastic)
    checks.check_ray_features("2.50.1", fixed)
    fails(checks.check_ray_features, "2.54.1", elastic, parameter="num_workers", fix="first comes with Ray 2.55")


@pytest.mark.parametrize("bad", [0, -1, math.inf, math.nan, "1", True, None])
def test_positive(bad):
    fails(checks.check_positive, "p", bad, parameter="p", fix="greater than 0")


def test_positive_values():
    assert checks.check_positive("p", 0.5) == 0.5
    assert checks.check_positive("p", None, allow_none=True) is None
    fails(checks.check_positive, "p", 1.5, integer=True, fix="whole number greater than 0")
    fails(checks.check_positive, "p", None, fix="greater than 0")


def test_seconds():
    assert checks.check_seconds("t", timedelta(minutes=2)) == 120.0
    assert checks.check_seconds("t", 0) == 0.0
    assert checks.check_seconds("t", None, allow_none=True) is None
    for bad in (-1, "10", math.inf, True, timedelta(seconds=-1), None):
        fails(checks.check_seconds, "t", bad, parameter="t", fix="seconds (0 or more) or a timedelta")
    # More than a timedelta holds: Airflow's sensors make one of their timeout, and would overflow.
    fails(checks.check_seconds, "t", 8.64e13 + 1, parameter="t", fix="at most 86400000000000 seconds")


def test_max_failures():
    assert [checks.check_max_failures("max_failures", v) for v in (-1, 0, 3)] == [-1, 0, 3]
    for bad in (-2, "1", True, 1.0):
        fails(checks.check_max_failures, "max_failures", bad, parameter="max_failures", fix="-1 (retry without limit)")


def test_choice_and_bool():
    assert checks.check_choice("trainer_api", "v2", ("v2", "legacy")) == "v2"
    fails(checks.check_choice, "trainer_api", "v3", ("v2", "legacy"), parameter="trainer_api", fix="'v2', 'legacy'")
    assert checks.check_bool("b", False) is False
    for bad in ("false", 0, None):
        fails(checks.check_bool, "b", bad, parameter="b", fix="True or False")


# --- dicts ----------------------------------------------------------------------------------------


def test_json():
    assert checks.check_json("c", None) == {}
    assert checks.check_json("c", {"a": (1, 2)}) == {"a": [1, 2]}
    fails(checks.check_json, "c", [1], parameter="c", fix="give a dict")
    fails(checks.check_json, "c", {"m": object()}, parameter="c", fix="JSON-serialisable")
    fails(checks.check_json, "c", {"x": {1, 2}}, fix="JSON-serialisable")


def test_resources():
    assert checks.check_resources(None, False) is None
    assert checks.check_resources({"CPU": 2, "GPU": 1, "memory": 1e9, "custom": 0}, True) == {
        "CPU": 2.0,
        "GPU": 1.0,
        "memory": 1e9,
        "custom": 0.0,
    }
    assert checks.check_resources({"GPU": 0}, False) == {"GPU": 0.0}  # no GPU asked


@pytest.mark.parametrize(
    "value, use_gpu, fix",
    [
        ("CPU=2", False, '{"CPU": 1, "GPU": 1}'),
        ({"CPU": -1}, False, "negative"),
        ({"CPU": "one"}, False, "not a number"),
        ({"CPU": math.inf}, False, "not a number"),
        ({"CPU": True}, False, "not a number"),
        ({"": 1}, False, "non-empty string"),
        ({1: 1}, False, "non-empty string"),
        ({"gpu": 1}, True, "Ray spells it 'CPU', 'GPU' or 'memory'"),
        ({"Cpu": 1}, False, "unknown resource 'Cpu'"),
        ({"MEMORY": 1}, False, "'memory'"),
        ({"GPU": 1}, False, "use_gpu=True"),
    ],
)
def test_bad_resources(value, use_gpu, fix):
    fails(checks.check_resources, value, use_gpu, parameter="resources_per_worker", fix=fix)


def test_horovod_env():
    assert checks.check_horovod_env("horovod_env", None) == {}
    assert checks.check_horovod_env("horovod_env", {"HOROVOD_CYCLE_TIME": 1, "HOROVOD_FUSION_THRESHOLD": "0"}) == {
        "HOROVOD_CYCLE_TIME": "1",
        "HOROVOD_FUSION_THRESHOLD": "0",
    }
    fails(checks.check_horovod_env, "horovod_env", {"OMP_NUM_THREADS": "1"}, parameter="horovod_env", fix="HOROVOD_*")
    fails(checks.check_horovod_env, "horovod_env", {"HOROVOD_X": {"a": 1}}, fix="string or a number")
    fails(checks.check_horovod_env, "horovod_env", {"HOROVOD_X": None}, fix="string or a number")
    fails(checks.check_horovod_env, "horovod_env", "HOROVOD_X=1", fix="give a dict")


def test_nics():
    assert checks.check_nics("horovod_nics", None) is None
    assert checks.check_nics("horovod_nics", "eth0") == ["eth0"]
    # Candidates in order of preference: kept as given, duplicates dropped.
    assert checks.check_nics("horovod_nics", ["ib0", "eth0", "ib0"]) == ["ib0", "eth0"]
    assert checks.check_nics("horovod_nics", ("ens5", "eth0")) == ["ens5", "eth0"]
    for bad in ([""], [7], 7, [], {"ib0", "eth0"}):
        fails(checks.check_nics, "horovod_nics", bad, parameter="horovod_nics", fix="interface names")


# --- ids and connections --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad, fix",
    [
        ("", "xcom_pull"),
        ("   ", "xcom_pull"),
        (None, "xcom_pull"),
        (42, "xcom_pull"),
        ("None", "the template rendered None"),
        ("a/b", "no spaces, '/'"),
        ("ahp-x/../../version", "'/'"),
        ("a b", "as the Ray dashboard shows it"),
        ("a?b", "'?'"),
        ("a#b", "'#'"),
    ],
)
def test_bad_submission_ids(bad, fix):
    fails(checks.check_submission_id, "submission_id", bad, parameter="submission_id", fix=fix)


def test_submission_id_is_stripped():
    assert checks.check_submission_id("submission_id", "  raysubmit_abc\n") == "raysubmit_abc"


def test_ray_conn_id():
    assert checks.check_ray_conn_id("ray_conn_id", "my_ray") == "my_ray"
    for bad in ("", "  ", None, 5):
        fails(checks.check_ray_conn_id, "ray_conn_id", bad, parameter="ray_conn_id", fix="'ray_default'")


@pytest.mark.parametrize(
    "forward, conn, ttl, parameter, fix",
    [
        ("yes", "aws", 3600, "forward_aws_credentials", "True or False"),
        (True, None, 3600, "forward_aws_credentials", "set aws_conn_id"),
        (True, "", 3600, "forward_aws_credentials", "set aws_conn_id"),
        (True, "aws", 60, "aws_credentials_ttl_seconds", "900 to 129600"),
        (True, "aws", 129601, "aws_credentials_ttl_seconds", "900 to 129600"),
        (True, "aws", 2.5e3, "aws_credentials_ttl_seconds", "whole seconds"),
        (True, "aws", True, "aws_credentials_ttl_seconds", "whole seconds"),
    ],
)
def test_bad_forwarding_settings(forward, conn, ttl, parameter, fix):
    fails(checks.check_forwarding, forward, conn, ttl, parameter=parameter, fix=fix)


def test_forwarding():
    assert checks.check_forwarding(False, None, 0) is False
    assert checks.check_forwarding(True, "aws", 900) is True
    assert checks.check_forwarding(True, "aws", 129600) is True


def test_job_tags():
    assert checks.check_job_tags("job_tags", None) == {}
    tags = {"team": "ranking", "model": "ctr", "cost_centre": "cc-4711"}
    assert checks.check_job_tags("job_tags", tags) == tags


@pytest.mark.parametrize(
    "bad, fix",
    [
        (["team", "ranking"], "give a dict of strings"),
        ("team=ranking", "give a dict of strings"),
        ({"team": 7}, "tag 'team' has the int 7: Ray's job metadata holds strings only; give it as '7'"),
        ({"": "x"}, "tag name '' must be a non-empty string"),
        ({1: "x"}, "tag name 1 must be a non-empty string"),
        ({"ahp_kind": "train"}, "tag 'ahp_kind' is reserved"),
        ({"ahp_anything": "x"}, "the provider names its own metadata ahp_*"),
        ({"airflow_dag_id": "other"}, "tag 'airflow_dag_id' is reserved"),
        ({"job_submission_id": "x"}, "tag 'job_submission_id' is reserved"),
    ],
)
def test_bad_job_tags_name_the_parameter_and_the_fix(bad, fix):
    fails(checks.check_job_tags, "job_tags", bad, parameter="job_tags", fix=fix)


def test_prices():
    assert checks.check_prices("prices", None) is None
    assert checks.check_prices("prices", {"cpu_hour": 0.05, "gpu_hour": 2, "currency": "EUR"}) == {
        "cpu_hour": 0.05,
        "gpu_hour": 2,
        "currency": "EUR",
    }


@pytest.mark.parametrize(
    "bad, fix",
    [
        ({}, "give a dict such as"),
        (0.05, "give a dict such as"),
        ({"cpu": 0.05}, "unknown key(s) ['cpu']"),
        ({"cpu_hour": -1}, "cpu_hour must be a number, 0 or more"),
        ({"gpu_hour": "2"}, "gpu_hour must be a number"),
        ({"cpu_hour": 1, "currency": 1}, "currency must be a string"),
    ],
)
def test_bad_prices(bad, fix):
    fails(checks.check_prices, "prices", bad, parameter="prices", fix=fix)
