"""The parameter checks, one by one: the value they return, and for bad values an
InvalidParameterError naming the parameter, the value and the fix (never a secret's value).

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


# --- storage and datasets -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "good, root",
    [
        ("/abs/dir", "/abs/dir"),
        ("file:///abs/dir", "/abs/dir"),
        ("file://localhost/abs", "/abs"),
        ("s3://bucket", "s3://bucket"),
        ("s3://b/p/", "s3://b/p"),
        ("/abs/./x/../dir/", "/abs/dir"),
    ],
)
def test_good_storage_paths_are_normalised(good, root):
    assert checks.check_storage_path(good) == root


@pytest.mark.parametrize(
    "bad, fix",
    [
        ("", "s3://bucket/prefix"),
        ("   ", "s3://bucket/prefix"),
        (None, "s3://bucket/prefix"),
        (5, "s3://bucket/prefix"),
        ("gs://bucket/x", "scheme 'gs' is not supported"),
        ("hdfs://nn/x", "scheme 'hdfs' is not supported"),
        ("s3:///nobucket", "name the bucket"),
        ("relative/dir", "absolute"),
        ("file://data/checkpoints", "file:///abs/path"),
        ("file://", "file:///abs/path"),
    ],
)
def test_bad_storage_paths(bad, fix):
    fails(checks.check_storage_path, bad, parameter="storage_path", fix=fix)


@pytest.mark.parametrize(
    "uri, fmt",
    [
        ("s3://b/train/", "parquet"),
        ("/data/v.csv", "csv"),
        ("s3://b/X.CSV", "csv"),
        ("file:///x.json", "json"),
        ("gs://b/x.jsonl", "json"),
        ("/data/part.parquet", "parquet"),
        ("s3://b/dir.csv/", "csv"),
    ],
)
def test_dataset_format(uri, fmt):
    assert checks.dataset_format(uri) == fmt


def make_rows():
    return None


def test_datasets_of_every_kind():
    specs, files = checks.check_datasets(
        {
            "train": "s3://b/train/",
            "val": "/data/v.csv",
            "test": "file:///t.json",
            "built": make_rows,
            "imported": "airflow_provider_horovod.examples.quickstart:make_dataset",
        }
    )
    assert specs == {
        "train": {"uri": "s3://b/train/", "format": "parquet"},
        "val": {"uri": "/data/v.csv", "format": "csv"},
        "test": {"uri": "file:///t.json", "format": "json"},
        "built": {"pickle": "dataset_built.pkl", "source": __file__},
        "imported": {"import": "airflow_provider_horovod.examples.quickstart:make_dataset"},
    }
    assert set(files) == {"dataset_built.pkl"}
    assert checks.check_datasets(None) == ({}, {})


class DatasetLike:
    def iter_batches(self):
        return iter(())


@pytest.mark.parametrize(
    "value, parameter, fix",
    [
        (["s3://b/x"], "datasets", "give a dict"),
        ({"bad name": "s3://b/x"}, "datasets", "simple name"),
        ({1: "s3://b/x"}, "datasets", "simple name"),
        ({"train": 5}, "datasets['train']", "URI of parquet"),
        ({"train": ""}, "datasets['train']", "s3://"),
        ({"train": "ftp://h/x.parquet"}, "datasets['train']", "gs://"),
        ({"train": DatasetLike()}, "datasets['train']", "wrap it in a function"),
        ({"train": "no_such_module_xyz:make"}, "datasets['train']", "not importable"),
    ],
)
def test_bad_datasets(value, parameter, fix):
    fails(checks.check_datasets, value, parameter=parameter, fix=fix)


def test_dataset_import_path_not_looked_up_when_code_ships():
    specs, _ = checks.check_datasets({"train": "no_such_module_xyz:make"}, code_ships=True)
    assert specs == {"train": {"import": "no_such_module_xyz:make"}}


# --- runtime_env ----------------------------------------------------------------------------------


def test_runtime_env_good_forms(tmp_path):
    (tmp_path / "wd").mkdir()
    (tmp_path / "mod").mkdir()
    whl = tmp_path / "pkg-1.0-py3-none-any.whl"
    whl.write_bytes(b"PK")
    single = tmp_path / "helpers.py"
    single.write_text("X = 1\n")
    zipped = tmp_path / "wd.zip"
    zipped.write_bytes(b"PK")
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("pandas\n")
    assert checks.check_runtime_env("runtime_env", None) == {}
    for env in (
        {"working_dir": str(tmp_path / "wd"), "py_modules": [str(tmp_path / "mod"), str(whl), str(single)]},
        {"working_dir": str(zipped)},
        {"working_dir": "s3://bucket/wd.zip", "py_modules": ["gcs://_ray_pkg_abc.zip", "https://h/m.zip"]},
        {"pip": ["pandas==2.2"]},
        {"pip": ("pandas",)},
        {"pip": {"packages": ["pandas"], "pip_check": False}},
        {"pip": str(requirements)},
        {"env_vars": {"MODE": "fast", "OMP_NUM_THREADS": "1"}, "excludes": ["*.ckpt"]},
        {"conda": {"dependencies": ["x"]}, "config": {"setup_timeout_seconds": 60}},
    ):
        checked = checks.check_runtime_env("runtime_env", env)
        assert checked == env and checked is not env


@pytest.mark.parametrize(
    "name", ["AWS_SECRET_ACCESS_KEY", "HF_TOKEN", "DB_PASSWORD", "my_credentials", "AWS_ACCESS_KEY_ID", "github_token"]
)
def test_runtime_env_refuses_secret_looking_env_vars_without_echoing_them(name):
    err = fails(
        checks.check_runtime_env,
        "runtime_env",
        {"env_vars": {name: SECRET, "MODE": "x"}},
        parameter="runtime_env",
        fix="looks like a secret",
    )
    assert SECRET not in str(err) and SECRET not in repr(err.value)
    assert err.value == {"env_vars": {name: "***", "MODE": "***"}}
    assert repr(name) in str(err)


def test_runtime_env_errors_never_echo_env_var_values():
    err = fails(
        checks.check_runtime_env,
        "runtime_env",
        {"pips": ["x"], "env_vars": {"MODE": SECRET}},
        fix="unknown field 'pips'",
    )
    assert SECRET not in str(err)


@pytest.mark.parametrize(
    "env, fix",
    [
        ("pip", "give a dict"),
        ({"pips": ["pandas"]}, "unknown field 'pips'; Ray's runtime_env fields are: conda, config"),
        ({"env_vars": ["MODE=1"]}, "env_vars must be a dict"),
        ({"env_vars": {"MODE": 1}}, "must map a string to a string"),
        ({"working_dir": 5}, "working_dir must be a local folder or a URI"),
        ({"working_dir": "/no/such/dir"}, "working_dir '/no/such/dir' is not a folder here"),
        ({"working_dir": "/no/such/archive.zip"}, "working_dir '/no/such/archive.zip' is not a folder here"),
        ({"py_modules": "/tmp"}, "py_modules must be a list"),
        ({"py_modules": [5]}, "py_modules must be a list"),
        ({"py_modules": ["/no/such/module"]}, "py_modules entry '/no/such/module' is neither an existing folder"),
        ({"py_modules": ["/no/such/pkg-1.0-py3-none-any.whl"]}, "is neither an existing folder"),
        ({"pip": "/no/such/requirements.txt"}, "the path of a requirements file"),
        ({"pip": 5}, "pip must be a list of requirements"),
        ({"excludes": "*.ckpt"}, "excludes must be a list of patterns"),
        ({"excludes": [1]}, "excludes must be a list of patterns"),
        ({"config": {"x": object()}}, "JSON-serialisable"),
    ],
)
def test_bad_runtime_env(env, fix):
    fails(checks.check_runtime_env, "runtime_env", env, parameter="runtime_env", fix=fix)


def test_runtime_env_py_modules_file_of_another_kind(tmp_path):
    other = tmp_path / "notes.txt"
    other.write_text("x")
    fails(
        checks.check_runtime_env,
        "runtime_env",
        {"py_modules": [str(other)]},
        fix="is neither an existing folder, .py or .whl",
    )


def test_runtime_env_check_names_the_given_parameter():
    fails(checks.check_runtime_env, "extra_env", {"pips": []}, parameter="extra_env")


def test_masked_and_is_uri():
    env = {"env_vars": {"A": "1"}, "pip": ["x"]}
    assert checks.masked(env) == {"env_vars": {"A": "***"}, "pip": ["x"]} and env["env_vars"] == {"A": "1"}
    assert checks.masked({"env_vars": ["A=1"]}) == {"env_vars": ["A=1"]}
    assert [
        checks.is_uri(p)
        for p in (
            "s3://b/x",
            "gcs://_ray_pkg_a.zip",
            "https://h/x.zip",
            "/local/dir",
            "pkg.mod:fn",
            "ftp://h/x",
            "s3:/b",
        )
    ] == [True, True, True, False, False, False, False]


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
    fails(checks.check_submission_id, bad, parameter="submission_id", fix=fix)


def test_submission_id_is_stripped():
    assert checks.check_submission_id("  raysubmit_abc\n") == "raysubmit_abc"


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


# --- MLflow tracking ------------------------------------------------------------------------------


@pytest.mark.parametrize("uri", ["http://mlflow:5000", "https://mlflow.example.com/prefix", " databricks "])
def test_mlflow_tracking_uri(uri):
    assert checks.check_mlflow_tracking_uri(uri) == uri.strip()
    assert checks.check_mlflow_tracking_uri(None) is None and checks.check_mlflow_tracking_uri("") is None


@pytest.mark.parametrize("uri", ["mlflow:5000", "/var/mlruns", "file:///mlruns", "sqlite:///m.db", 5000, "http://"])
def test_mlflow_tracking_uri_that_is_not_a_server(uri):
    fails(checks.check_mlflow_tracking_uri, uri, parameter="mlflow_tracking_uri", fix="tracking server")


def test_mlflow_tracking_uri_with_credentials_is_refused_without_showing_them():
    err = fails(
        checks.check_mlflow_tracking_uri,
        f"https://user:{SECRET}@mlflow:5000",
        parameter="mlflow_tracking_uri",
        fix="mlflow_conn_id",
    )
    assert SECRET not in str(err)


def test_mlflow_uri_and_connection_exclude_each_other():
    checks.check_mlflow("http://mlflow:5000", None)
    checks.check_mlflow(None, "mlflow_default")
    fails(checks.check_mlflow, "http://mlflow:5000", "mlflow_default", parameter="mlflow_conn_id", fix="not both")
    fails(checks.check_mlflow, None, " ", parameter="mlflow_conn_id")


def test_mlflow_experiment_name():
    assert checks.check_mlflow_experiment_name(None, "my_dag") == "my_dag"
    assert checks.check_mlflow_experiment_name(" retraining ", "my_dag") == "retraining"
    fails(checks.check_mlflow_experiment_name, "", "my_dag", parameter="mlflow_experiment_name")


def conn(**fields):
    from types import SimpleNamespace

    return SimpleNamespace(**{"host": None, "port": None, "schema": None, "login": None, "password": None, **fields})


@pytest.mark.parametrize(
    ("fields", "uri", "auth"),
    [
        ({"host": "http://mlflow:5000"}, "http://mlflow:5000", {}),
        ({"host": "mlflow", "port": 5000}, "http://mlflow:5000", {}),
        (
            {"host": "mlflow.example.com", "schema": "https", "password": SECRET},
            "https://mlflow.example.com",
            {"token": SECRET},
        ),
        (
            {"host": "https://mlflow.example.com", "login": "bot", "password": SECRET},
            "https://mlflow.example.com",
            {"username": "bot", "password": SECRET},
        ),
        ({"host": "databricks", "password": SECRET}, "databricks", {"token": SECRET}),
    ],
)
def test_an_mlflow_connection_gives_the_uri_and_the_credentials(fields, uri, auth):
    assert checks.mlflow_connection("mlflow_default", conn(**fields)) == (uri, auth)


def test_an_mlflow_connection_without_a_server_fails_naming_it():
    fails(checks.mlflow_connection, "mlflow_default", conn(), parameter="mlflow_conn_id", fix="no host")
    err = fails(
        checks.mlflow_connection, "mlflow_default", conn(host="sqlite:///m.db", password=SECRET), fix="tracking server"
    )
    assert "mlflow_default" in err.parameter and SECRET not in str(err)
