"""Building the trainers from a spec, on the cluster side (no cluster needed to build them)."""

import json
import os

import pytest

from airflow_provider_horovod.documents import TrainingSpec
from airflow_provider_horovod.runtime.ray_compat import PREEMPTION_WATCHER_ENV, WORKER_GROUP_START_TIMEOUT_ENV
from airflow_provider_horovod.runtime.trainers import (
    NO_LIMIT_S,
    build_v2_trainer,
    worker_group_start_timeout_s,
)


def train(config):
    pass


def spec(tmp_path, **kwargs) -> TrainingSpec:
    return TrainingSpec(submission_id="ahp-x-a1", train_fn={"import": "m:f"}, storage_uri=str(tmp_path), **kwargs)


@pytest.mark.parametrize(("pending", "expected"), [(900, 900.0), (5, 5.0), (None, NO_LIMIT_S)])
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


def test_only_a_scripts_ranks_start_at_niceness_0(tmp_path):
    """horovodrun's ranks run at 0; Ray starts its workers at 15 (a script's driver connects at 0, script.py)."""
    script = build_v2_trainer(spec(tmp_path, script={"path": "train.py", "args": []}), train, {}, None)
    assert script.run_config.worker_runtime_env["env_vars"]["RAY_worker_niceness"] == "0"
    function = build_v2_trainer(spec(tmp_path), train, {}, None)
    assert "RAY_worker_niceness" not in function.run_config.worker_runtime_env.get("env_vars", {})


def test_a_scripts_run_starts_no_preemption_watcher(tmp_path, monkeypatch):
    """A script cannot read a preemption notice (nothing hands it one), and the watcher is one more Ray process
    starting beside its ranks: off for a script, Ray's own default for a function."""
    from ray.train.v2._internal.constants import ENV_VARS_TO_PROPAGATE

    assert PREEMPTION_WATCHER_ENV in ENV_VARS_TO_PROPAGATE  # the driver's value reaches the controller
    monkeypatch.setenv(PREEMPTION_WATCHER_ENV, "unset")
    monkeypatch.delenv(PREEMPTION_WATCHER_ENV)
    build_v2_trainer(spec(tmp_path), train, {}, None)
    assert PREEMPTION_WATCHER_ENV not in os.environ
    build_v2_trainer(spec(tmp_path, script={"path": "train.py", "args": []}), train, {}, None)
    assert os.environ[PREEMPTION_WATCHER_ENV] == "0"


def test_ray_train_gets_the_users_function_with_the_right_number_of_parameters(tmp_path, monkeypatch):
    """Ray passes `config` only to a function with one parameter: each wrapper keeps the user's shape."""
    import inspect

    from airflow_provider_horovod.runtime import trainers

    kept = []
    monkeypatch.setattr(trainers, "keep_rank0_return", lambda value, uri: kept.append((value, uri)))
    monkeypatch.setattr(trainers, "worker_started", lambda spec: None)  # needs a worker of Ray Train

    def with_config(config):
        return config["x"]

    def bare():
        return "bare"

    def called(a, b=0):
        return a + b

    base = spec(tmp_path)
    wrapped = trainers.per_worker(base, with_config)
    assert len(inspect.signature(wrapped).parameters) == 1
    assert wrapped({"x": 5}) is None
    assert len(inspect.signature(trainers.per_worker(base, bare)).parameters) == 0
    call = TrainingSpec(
        submission_id="s-a1",
        train_fn={"import": "m:f"},
        storage_uri=str(tmp_path),
        train_args=[1],
        train_kwargs={"b": 2},
    )
    wrapped_call = trainers.per_worker(call, called)
    assert len(inspect.signature(wrapped_call).parameters) == 0
    trainers.per_worker(base, bare)()
    wrapped_call()
    assert [v for v, _ in kept] == [5, "bare", 3]
    assert {u for _, u in kept} == {base.return_value_uri}


def test_a_return_value_that_is_not_json_fails_rank_0(tmp_path, monkeypatch):
    import ray.train

    from airflow_provider_horovod.runtime import trainers

    class Rank0:
        def get_world_rank(self):
            return 0

    monkeypatch.setattr(ray.train, "get_context", lambda: Rank0())
    uri = str(tmp_path / "attempt-1" / "return_value.json")
    trainers.keep_rank0_return({"loss": 0.5}, uri)
    assert json.loads(open(uri).read()) == {"loss": 0.5}
    with pytest.raises(TypeError, match="train_fn returned a object, which XCom cannot hold as JSON"):
        trainers.keep_rank0_return(object(), uri)


def test_rank_0s_own_error_writes_its_reports_first(tmp_path, monkeypatch):
    import ray.train

    import airflow_provider_horovod.runtime.history as runtime_history
    from airflow_provider_horovod.runtime import trainers

    class Rank0:
        def get_world_rank(self):
            return 0

    monkeypatch.setattr(ray.train, "get_context", lambda: Rank0())
    history = runtime_history.History()
    history.uri = str(tmp_path / "metrics_history.json")
    monkeypatch.setattr(trainers, "HISTORY", history)
    history.add(runtime_history.point({"loss": 1.0}, 1, None))
    history.add(runtime_history.point({"loss": 0.9}, 2, None))  # within HISTORY_WRITE_S: not on disk yet

    def fails(config):
        raise ValueError("a bug after two reports")

    with pytest.raises(ValueError):
        trainers.call(fails, {})
    assert [p["metrics"]["loss"] for p in json.load(open(history.uri))] == [1.0, 0.9]


# --- elastic runs ------------------------------------------------------------------------------------


def test_an_elastic_range_becomes_ray_train_v2s_elastic_scaling(tmp_path):
    from airflow_provider_horovod.runtime.trainers import scaling_config

    config = scaling_config(spec(tmp_path, num_workers=[2, 4], elastic_resize_monitor_interval_s=5.0))
    assert (config.num_workers, config.min_workers, config.max_workers) == ((2, 4), 2, 4)
    assert config.elastic_resize_monitor_interval_s == 5.0
    assert scaling_config(spec(tmp_path, num_workers=3)).num_workers == 3


def test_the_legacy_trainer_refuses_an_elastic_range(tmp_path):
    from airflow_provider_horovod.runtime.trainers import build_legacy_trainer

    with pytest.raises(ValueError, match=r"num_workers=\[2, 4\]: trainer_api='legacy'.*no elastic"):
        build_legacy_trainer(spec(tmp_path, num_workers=[2, 4], trainer_api="legacy"), train, {}, None)


def test_segments_of_a_run_from_rank_0s_notes():
    from airflow_provider_horovod.runtime.trainers import segments

    notes = [
        {"started_at": 1.0, "world_size": 4, "reason": "start"},
        {"started_at": 9.0, "world_size": 2, "reason": "node lost"},
        {"started_at": 20.0, "world_size": 4, "reason": "grow"},
    ]
    assert segments(notes) == notes
    # Ray's HorovodTrainer gives no reason: the first group is the start, the others restarts.
    assert [
        s["reason"] for s in segments([{"started_at": 1.0, "world_size": 2}, {"started_at": 5.0, "world_size": 2}])
    ] == ["start", "failure"]
    assert segments([]) == []
