"""Building the trainers from a spec, on the cluster side (no cluster needed to build them)."""

import os

import pytest

from airflow_provider_horovod.runtime.trainers import (
    NO_LIMIT_S,
    WORKER_GROUP_START_TIMEOUT_ENV,
    build_v2_trainer,
    worker_group_start_timeout_s,
)
from airflow_provider_horovod.spec import TrainingSpec


def train(config):
    pass


def spec(tmp_path, **kwargs) -> TrainingSpec:
    return TrainingSpec(submission_id="ahp-x-a1", train_fn={"import": "m:f"}, storage_uri=str(tmp_path), **kwargs)


@pytest.mark.parametrize(("pending", "expected"), [(900, 900.0), (5, 60.0), (None, NO_LIMIT_S)])
def test_train_v2_waits_for_its_workers_as_long_as_the_pending_timeout(tmp_path, pending, expected):
    assert worker_group_start_timeout_s(spec(tmp_path, pending_timeout_s=pending)) == expected


def test_the_wait_reaches_ray_train_v2s_controller(tmp_path, monkeypatch):
    from ray.train.v2._internal.constants import ENV_VARS_TO_PROPAGATE

    # The driver's value travels to the controller only if Ray propagates this variable.
    assert WORKER_GROUP_START_TIMEOUT_ENV in ENV_VARS_TO_PROPAGATE
    # Set, then removed: monkeypatch then restores the variable (or its absence) after the test.
    monkeypatch.setenv(WORKER_GROUP_START_TIMEOUT_ENV, "unset")
    monkeypatch.delenv(WORKER_GROUP_START_TIMEOUT_ENV)
    build_v2_trainer(spec(tmp_path, pending_timeout_s=900), train, {}, None)
    assert os.environ[WORKER_GROUP_START_TIMEOUT_ENV] == "900.0"


def test_a_users_own_worker_group_timeout_is_kept(tmp_path, monkeypatch):
    monkeypatch.setenv(WORKER_GROUP_START_TIMEOUT_ENV, "42")  # from the job's runtime_env env_vars
    build_v2_trainer(spec(tmp_path, pending_timeout_s=900), train, {}, None)
    assert os.environ[WORKER_GROUP_START_TIMEOUT_ENV] == "42"
