"""Builds and runs the Horovod trainer of a training spec, on the cluster: the datasets, the trainer
of either API, what every worker does around the user's function (its reports recorded, its
checkpoint uploads routed, rank 0's return value kept), and the attempt's record."""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from typing import Any

from airflow_provider_horovod import failures
from airflow_provider_horovod.contract import (
    SEGMENT_FAILURE,
    SEGMENT_START,
    WORKER_GROUP_REASON_ENV,
    TrainerApi,
    required_positional,
    timings,
)
from airflow_provider_horovod.documents import ResultRecord, TrainingSpec
from airflow_provider_horovod.exceptions import PendingTimeoutError, SmokeRunDone
from airflow_provider_horovod.runtime import ray_compat, smoke
from airflow_provider_horovod.runtime.aws_session import read_session, s3_filesystem, session_env, with_env
from airflow_provider_horovod.runtime.datasets import load_datasets, materialized
from airflow_provider_horovod.runtime.history import HISTORY
from airflow_provider_horovod.runtime.payload import load_callable
from airflow_provider_horovod.runtime.records import (
    exists,
    latest_checkpoint,
    note_worker_group,
    read_json,
    to_uri,
    write_json,
    write_record,
    write_text,
)
from airflow_provider_horovod.runtime.uploads import route_uploads

# Train V2's controller polls its workers every 2 s by default: a training's end, and a report with its
# checkpoint, are seen up to that late. A poll is a small call per worker; 0.5 s costs little.
HEALTH_CHECK_INTERVAL_S = 0.5
# pending_timeout_seconds=None means no limit; a week stands for it.
NO_LIMIT_S = 7 * 24 * 3600.0


def worker_group_start_timeout_s(spec: TrainingSpec) -> float:
    """How long Ray Train V2 waits for its workers' resources before it asks again."""
    return float(spec.pending_timeout_s) if spec.pending_timeout_s else NO_LIMIT_S


def takes_config(fn: Callable) -> bool:
    """Ray passes ``train_loop_config`` only to functions with a required parameter."""
    return required_positional(fn) > 0


def worker_started(spec: TrainingSpec) -> None:
    """In each worker, before the user's function: checkpoint copies at S3's speed, rank 0's reports
    recorded as they come, and the worker group's start noted (the cost's worker-seconds start there)."""
    import ray.train

    route_uploads()
    HISTORY.record(spec.history_uri)
    if spec.smoke_run:  # after the history's wrapper: the last report is recorded before the stop
        smoke.stop_after_first_checkpoint()
    context = ray.train.get_context()
    if context.get_world_rank() == 0:
        HISTORY.resume()
        if spec.tracking:  # MLflow: only then is runtime.tracking imported
            from airflow_provider_horovod.runtime.tracking import TRACKER

            TRACKER.follow(spec, HISTORY.listeners)
        # Why this group started: the V2 backend says (runtime.horovod_backend); segments() fills in the rest.
        note_worker_group(spec.worker_groups_uri, context.get_world_size(), os.environ.get(WORKER_GROUP_REASON_ENV))


def worker_finished(spec: TrainingSpec, value: Any) -> None:
    """In each worker, after the user's function: rank 0 leaves what it returned and its reports."""
    from airflow_provider_horovod.runtime.horovod_backend import shut_down_horovod

    keep_rank0_return(value, spec.return_value_uri)
    HISTORY.write()
    shut_down_horovod()  # with the other ranks, before Ray Train ends any of their processes
    store_timeline(spec)


def store_timeline(spec: TrainingSpec) -> None:
    """After training and Horovod's shutdown, which closes the timeline: rank 0 stores it, when it is on."""
    if not spec.horovod_timeline:
        return
    import ray.train

    if ray.train.get_context().get_world_rank() == 0 and os.path.exists(spec.timeline_local_path):
        with open(spec.timeline_local_path, encoding="utf-8") as f:
            write_text(spec.timeline_uri, f.read())
        os.remove(spec.timeline_local_path)  # the node outlives the job, and a long run's timeline is large
        print(f"Horovod timeline: {spec.timeline_uri}", flush=True)


def keep_rank0_return(value: Any, uri: str) -> None:
    """Rank 0 leaves what the training function returned where the driver reads it (JSON: it goes to XCom)."""
    import ray.train

    if value is None or ray.train.get_context().get_world_rank() != 0:
        return
    try:
        json.dumps(value)
    except (TypeError, ValueError) as err:
        raise TypeError(
            f"train_fn returned a {type(value).__name__}, which XCom cannot hold as JSON ({err}). Return "
            "numbers, strings, lists or dicts; save models in the checkpoint."
        ) from None
    write_json(uri, value)


def per_worker(spec: TrainingSpec, fn: Callable) -> Callable:
    """What Ray Train runs on every worker: the user's function, called as the spec says (with
    ``config``, or with the arguments of a ``@task.horovod`` call), its rank 0 return value kept.
    Ray passes ``config`` only to a function with one parameter, so each wrapper has the right number.
    Each also routes the worker's checkpoint copies through boto3, records rank 0's reports, and
    marks what the function raised as the user's (``failures.mark_user_error``)."""
    if spec.train_args is not None:
        args, kwargs = list(spec.train_args), dict(spec.train_kwargs or {})

        def called_with_arguments():
            worker_started(spec)
            worker_finished(spec, call(fn, *args, **kwargs))

        return called_with_arguments
    if takes_config(fn):

        def called_with_config(config):
            worker_started(spec)
            worker_finished(spec, call(fn, config))

        return called_with_config

    def called_bare():
        worker_started(spec)
        worker_finished(spec, call(fn))

    return called_bare


def call(fn: Callable, *args: Any, **kwargs: Any) -> Any:
    try:
        return fn(*args, **kwargs)
    except SmokeRunDone:  # a smoke run's first checkpoint is reported: the training ends there
        return None
    except Exception as err:
        import ray.train

        failures.mark_user_error(err, ray.train.get_context().get_world_rank())
        HISTORY.write_or_say()  # on rank 0, its reports not written yet (other ranks have none)
        raise


class FailFastOnUserErrors:
    """Ray Train V2's failure policy, except that a user's error (or a module the cluster lacks) fails
    the run at once: restarting every worker would fail the same way. Lost workers and nodes still
    go through Ray Train's own policy (``max_failures``; preemptions ``max_preemption_failures``)."""

    def __init__(self, failure_config: Any) -> None:
        self.default = ray_compat.default_failure_policy(failure_config)

    def make_decision(self, training_failed_error: BaseException) -> Any:
        if not failures.of_error(training_failed_error, user_code=False).failure_class.retryable:
            return ray_compat.failure_decision_raise()
        return self.default.make_decision(training_failed_error)


def fail_fast_on_user_errors(trainer: Any) -> Any:
    """The V2 trainer, its controller given ``FailFastOnUserErrors`` instead of Ray Train's default."""
    return ray_compat.with_controller_args(
        trainer, lambda _: {"failure_policy": FailFastOnUserErrors(trainer.run_config.failure_config)}
    )


def pending_timeout_error(spec: TrainingSpec) -> PendingTimeoutError:
    """The workers found no room in time: what they asked for, and what the cluster has."""
    import ray

    bundle = spec.worker_resources()
    return PendingTimeoutError(
        f"the {spec.min_workers} workers, each asking for {json.dumps(bundle, sort_keys=True)}, found no room "
        f"within {worker_group_start_timeout_s(spec):g} s (pending_timeout_seconds); the cluster has "
        f"{json.dumps(ray.cluster_resources(), sort_keys=True)} of which "
        f"{json.dumps(ray.available_resources(), sort_keys=True)} are free. Give the cluster those resources, lower "
        "num_workers/resources_per_worker, or raise pending_timeout_seconds."
    )


def wait_for_resources(spec: TrainingSpec) -> None:
    """Legacy trainer: fail clearly when the workers' resources do not appear within the pending
    timeout (Train V1 would wait for ever for GPUs that no node has, the job RUNNING all along).
    Train V2 waits for them itself, as long as the same timeout, and then fails the run."""
    if not spec.pending_timeout_s:
        return
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    group = placement_group([spec.worker_resources()] * spec.min_workers, strategy="PACK")
    ready, _ = ray.wait([group.ready()], timeout=spec.pending_timeout_s)
    remove_placement_group(group)
    if not ready:
        raise pending_timeout_error(spec)


def resume_checkpoint(spec: TrainingSpec) -> str | None:
    """The newest checkpoint of the earlier attempts, newest attempt first."""
    for attempt_uri in spec.resume_from:
        if found := latest_checkpoint(attempt_uri):
            return found
    return None


def build_legacy_trainer(
    spec: TrainingSpec, train_fn: Callable, datasets: dict, resume_from: str | None, storage_fs=None
):
    """Ray's own HorovodTrainer (Train V1; needs RAY_TRAIN_V2_ENABLED=0 before ray.train loads)."""
    from ray.train import Checkpoint, CheckpointConfig, FailureConfig, RunConfig
    from ray.train.horovod import HorovodConfig, HorovodTrainer

    if spec.elastic:  # the plan refuses it before submission; a spec made elsewhere is refused here
        raise ValueError(
            f"num_workers={spec.num_workers}: trainer_api='legacy' (Ray's HorovodTrainer) has no elastic "
            "training; give a number of workers, or use trainer_api='v2'."
        )
    resume = None
    if resume_from:
        resume = (
            Checkpoint(path=resume_from.split("://", 1)[-1], filesystem=storage_fs)
            if storage_fs
            else Checkpoint(path=resume_from)
        )
    return HorovodTrainer(
        train_loop_per_worker=train_fn,
        train_loop_config=spec.train_loop_config if takes_config(train_fn) else None,
        # Ray's HorovodConfig takes a set and uses one name of it on every host: the first candidate,
        # which must then exist on all of them (the V2 backend picks per host).
        horovod_config=HorovodConfig(
            timeout_s=spec.horovod_timeout_s, nics=set(spec.horovod_nics[:1]) if spec.horovod_nics else None
        ),
        scaling_config=scaling_config(spec),
        run_config=run_config(spec, RunConfig, CheckpointConfig, FailureConfig, storage_fs),
        datasets=datasets or None,
        resume_from_checkpoint=resume,
    )


def build_v2_trainer(spec: TrainingSpec, train_fn: Callable, datasets: dict, resume_from: str | None, storage_fs=None):
    """Horovod on Ray Train V2, through the provider's own backend."""
    from ray.train import CheckpointConfig, FailureConfig, RunConfig

    from airflow_provider_horovod.runtime.horovod_backend import build_v2_trainer as build

    # V2 gives up on its workers' placement group after 60 s and asks again, for ever, logging a
    # traceback each time: on a busy cluster (a backfill) waiting jobs churn and flood the task log.
    # Wait as long as the operator's pending timeout instead (the driver's value reaches the controller).
    os.environ.setdefault(ray_compat.WORKER_GROUP_START_TIMEOUT_ENV, str(worker_group_start_timeout_s(spec)))
    os.environ.setdefault(ray_compat.HEALTH_CHECK_INTERVAL_ENV, str(HEALTH_CHECK_INTERVAL_S))
    if spec.script:  # it cannot read a preemption notice: the watcher would be one more process to start
        os.environ.setdefault(ray_compat.PREEMPTION_WATCHER_ENV, "0")
    # A worker group that cannot start within the pending timeout fails the run, saying why (Ray retries it for ever).
    config = run_config(spec, RunConfig, CheckpointConfig, FailureConfig, storage_fs, controller_failure_limit=0)
    trainer = build(
        train_fn,
        train_loop_config=spec.train_loop_config if takes_config(train_fn) else None,
        datasets=datasets or None,
        scaling_config=scaling_config(spec),
        run_config=config,
        resume_from=resume_from,
        timeout_s=spec.horovod_timeout_s,
        nics=list(spec.horovod_nics) if spec.horovod_nics else None,
        script=spec.script,
    )
    return trainer if spec.retry_on_user_error else fail_fast_on_user_errors(trainer)


def scaling_config(spec: TrainingSpec):
    from ray.train import ScalingConfig

    extra: dict[str, Any] = {}
    if spec.trainer_api == TrainerApi.LEGACY.value:
        # V1's coordinator only drives the workers; a whole CPU for it would cost a worker slot.
        # (V2's controller takes no CPU, and V2 refuses the argument.)
        extra["trainer_resources"] = {"CPU": 0}
    if spec.elastic:
        # Ray Train's elastic policy: starts once min fit, grows toward max every interval.
        extra["elastic_resize_monitor_interval_s"] = spec.elastic_resize_monitor_interval_s
    return ScalingConfig(
        num_workers=(spec.min_workers, spec.max_workers) if spec.elastic else spec.min_workers,
        use_gpu=spec.use_gpu,
        resources_per_worker=spec.resources_per_worker or None,
        **extra,
    )


def run_config(spec: TrainingSpec, RunConfig, CheckpointConfig, FailureConfig, storage_fs=None, **failure):
    """``storage_fs``: an explicit filesystem (forwarded credentials); paths then have no scheme.
    ``failure``: more of the trainer API's FailureConfig."""
    parent, name = spec.run_uri.rsplit("/", 1)
    return RunConfig(
        storage_path=parent.split("://", 1)[-1] if storage_fs else parent,
        storage_filesystem=storage_fs,
        name=name,
        checkpoint_config=CheckpointConfig(
            num_to_keep=spec.checkpoint_num_to_keep,
            checkpoint_score_attribute=spec.checkpoint_score_attribute,
            checkpoint_score_order=spec.checkpoint_score_order,
        ),
        failure_config=FailureConfig(max_failures=spec.max_failures, **failure),
    )


def segments(groups: list[dict]) -> list[dict]:
    """The run's segments from rank 0's notes of each worker group: ``{"started_at", "world_size",
    "reason"}``. A note without a reason (Ray's HorovodTrainer) is the start, or a restart after a failure."""
    return [
        {
            "started_at": g.get("started_at"),
            "world_size": int(g.get("world_size") or 0),
            "reason": g.get("reason") or (SEGMENT_START if i == 0 else SEGMENT_FAILURE),
        }
        for i, g in enumerate(groups)
    ]


TRAINER_BUILDERS = {TrainerApi.LEGACY.value: build_legacy_trainer, TrainerApi.V2.value: build_v2_trainer}


def json_safe(metrics: dict) -> dict:
    out = {}
    for key, value in metrics.items():
        if isinstance(value, float) and not math.isfinite(value):
            value = str(value)
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            continue
        out[key] = value
    return out


def best_checkpoint(result, spec: TrainingSpec):
    """The best checkpoint by the score attribute, else the latest."""
    if not spec.checkpoint_score_attribute or not result.best_checkpoints:
        return result.checkpoint
    scored = [(m.get(spec.checkpoint_score_attribute), c) for c, m in result.best_checkpoints]
    scored = [(s, c) for s, c in scored if isinstance(s, (int, float))]
    if not scored:
        return result.checkpoint
    return (max if spec.checkpoint_score_order == "max" else min)(scored, key=lambda sc: sc[0])[1]


def process_started_at(started_at: float) -> float:
    """When the driver's process started (else ``started_at``): from then to ``started_at``, Python's imports."""
    try:
        import psutil

        return psutil.Process().create_time()
    except Exception:  # noqa: BLE001 - a timing only; Ray's own nodes have psutil
        return started_at


def run(spec: TrainingSpec, folder: str, started_at: float) -> ResultRecord:
    """Train, then write the attempt's result record. Raises when training fails."""
    if spec.script:
        from airflow_provider_horovod.runtime import script

        train_fn = script.runner(spec)
    else:
        train_fn = load_callable(spec.train_fn, folder)
    s3_fs = None
    if session := read_session(folder):
        print(
            f"Using the AWS session credentials forwarded with the job (valid until {session['expiration']}).",
            flush=True,
        )
        env = session_env(session)
        os.environ.update(env)  # this driver: result record, resume lookup
        s3_fs = s3_filesystem(env)
        train_fn = with_env(train_fn, env)  # the training function's own S3 calls
    if spec.tracking:
        from airflow_provider_horovod.runtime.tracking import auth_env, summary

        if tracking_env := auth_env(folder):
            train_fn = with_env(train_fn, tracking_env)  # rank 0's MLflow client
    train_fn = per_worker(spec, train_fn)
    datasets = load_datasets(spec, folder, s3_fs)
    if spec.materialize_datasets:
        datasets = materialized(datasets)
    if spec.trainer_api == TrainerApi.LEGACY.value:
        wait_for_resources(spec)
    resume_from = resume_checkpoint(spec)
    if resume_from:
        print(f"Resuming from checkpoint {resume_from}", flush=True)
    storage_fs = s3_fs if spec.storage_uri.startswith("s3://") else None
    trainer = TRAINER_BUILDERS[spec.trainer_api](spec, train_fn, datasets, resume_from, storage_fs)
    fit_started_at = time.time()
    fit_start = time.monotonic()
    try:
        result = trainer.fit()
    except Exception as err:
        if ray_compat.startup_timed_out(err):
            raise pending_timeout_error(spec) from err
        raise
    fit_s = time.monotonic() - fit_start
    if getattr(result, "error", None):
        raise result.error
    latest = result.checkpoint
    best = best_checkpoint(result, spec)
    ran = segments(read_json(spec.worker_groups_uri) or [])
    history = read_json(spec.history_uri) or []
    metrics = dict(result.metrics or {})
    if not metrics and spec.script and history:  # Train V2 keeps only a checkpoint's metrics; a script may have none
        metrics = dict(history[-1].get("metrics") or {})
    latest_uri = to_uri(spec.storage_uri, latest.path) if latest else resume_from
    record = ResultRecord(
        submission_id=spec.submission_id,
        attempt=spec.attempt,
        storage_uri=spec.storage_uri,
        run_uri=spec.run_uri,
        # Resumed past the last epoch: the model is the checkpoint it resumed from.
        checkpoint_uri=latest_uri,
        best_checkpoint_uri=to_uri(spec.storage_uri, best.path) if best else latest_uri,
        metrics=json_safe(metrics),
        world_size=ran[-1]["world_size"] if ran else spec.min_workers,
        segments=ran,
        trainer_api=spec.trainer_api,
        checkpoint_score_attribute=spec.checkpoint_score_attribute,
        tracking=summary(spec) if spec.tracking else None,
        resumed_from=resume_from,
        timings=timings(
            started_at,
            process_started_at=process_started_at(started_at),
            fit_started_at=fit_started_at,
            fit_s=round(fit_s, 3),
        ),
        return_value=read_json(spec.return_value_uri),
        history=history,
        timeline_uri=spec.timeline_uri if spec.horovod_timeline and exists(spec.timeline_uri) else None,
        smoke_run=spec.smoke_run,
        script=(spec.script.get("path") or spec.script.get("module")) if spec.script else None,
    )
    write_record(spec.result_uri, record)
    return record
