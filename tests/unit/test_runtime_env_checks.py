"""The runtime_env check: the forms Ray takes, refused fields with the fix, and env var values
(secrets or not) never echoed.

The helper ``fails`` is test_checks.py's."""

from __future__ import annotations

import pytest

from airflow_provider_horovod import runtime_env_checks
from unit.test_checks import SECRET, fails


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
    assert runtime_env_checks.check_runtime_env("runtime_env", None) == {}
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
        checked = runtime_env_checks.check_runtime_env("runtime_env", env)
        assert checked == env
        assert checked is not env


@pytest.mark.parametrize(
    "name", ["AWS_SECRET_ACCESS_KEY", "HF_TOKEN", "DB_PASSWORD", "my_credentials", "AWS_ACCESS_KEY_ID", "github_token"]
)
def test_runtime_env_refuses_secret_looking_env_vars_without_echoing_them(name):
    err = fails(
        runtime_env_checks.check_runtime_env,
        "runtime_env",
        {"env_vars": {name: SECRET, "MODE": "x"}},
        parameter="runtime_env",
        fix="looks like a secret",
    )
    assert SECRET not in str(err)
    assert SECRET not in repr(err.value)
    assert err.value == {"env_vars": {name: "***", "MODE": "***"}}
    assert repr(name) in str(err)


def test_runtime_env_errors_never_echo_env_var_values():
    err = fails(
        runtime_env_checks.check_runtime_env,
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
    fails(runtime_env_checks.check_runtime_env, "runtime_env", env, parameter="runtime_env", fix=fix)


def test_runtime_env_py_modules_file_of_another_kind(tmp_path):
    other = tmp_path / "notes.txt"
    other.write_text("x")
    fails(
        runtime_env_checks.check_runtime_env,
        "runtime_env",
        {"py_modules": [str(other)]},
        fix="is neither an existing folder, .py or .whl",
    )


def test_runtime_env_check_names_the_given_parameter():
    fails(runtime_env_checks.check_runtime_env, "extra_env", {"pips": []}, parameter="extra_env")


def test_masked_and_is_uri():
    env = {"env_vars": {"A": "1"}, "pip": ["x"]}
    assert runtime_env_checks.masked(env) == {"env_vars": {"A": "***"}, "pip": ["x"]}
    assert env["env_vars"] == {"A": "1"}
    assert runtime_env_checks.masked({"env_vars": ["A=1"]}) == {"env_vars": ["A=1"]}
    assert [
        runtime_env_checks.is_uri(p)
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
