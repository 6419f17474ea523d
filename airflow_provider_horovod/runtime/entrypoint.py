"""The entrypoint of every job the provider submits:
``python -m airflow_provider_horovod.runtime.entrypoint train|task <payload module>``.

It reads the payload, checks that it can run here (the cluster's Ray and the trainer API a training runs
with, ``ray_compat``; the Python of pickled code), runs the training (``trainers.run``) or the function
(in the job's driver, with the resources the job asked for), writes the attempt's record and prints
it as one ``AHP_RESULT`` line. On failure it classifies what it caught (``failures.of_error``), prints
one ``AHP_ERROR`` line (the class and what failed) and its verdict as one ``AHP_FAILURE`` line, writes
the failed attempt's record beside its checkpoints, and exits 1, so the job ends FAILED and the Airflow
task says why. When Ray stops the job (SIGTERM to the driver: its task killed or marked failed, ``ray job
stop``, a timeout of the provider's), it writes the stopped attempt's record on its way out. A job stopped
while PENDING gets that SIGTERM as Ray starts it, before this module runs: the side that stopped it keeps the
record then (``jobs.stop``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import time
import traceback
from typing import Any

from airflow_provider_horovod import failures
from airflow_provider_horovod.contract import (
    ERROR_MARK,
    RESULT_MARK,
    JobKind,
    JobStatus,
    check_ray_version,
    marked,
    python_minor,
    timings,
    untested_ray_version,
)
from airflow_provider_horovod.documents import JobSpec, ResultRecord, TaskRecord, TaskSpec, TrainingSpec
from airflow_provider_horovod.exceptions import RayIncompatibleError
from airflow_provider_horovod.failures import Failure, FailureClass
from airflow_provider_horovod.runtime import ray_compat


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    kinds = [kind.value for kind in JobKind]
    if len(argv) != 2 or argv[0] not in kinds:
        print(
            f"usage: python -m airflow_provider_horovod.runtime.entrypoint {'|'.join(kinds)} <payload module>",
            file=sys.stderr,
        )
        return 2
    from airflow_provider_horovod.runtime.payload import read_payload

    started_at = time.time()
    spec_class: type[TrainingSpec] | type[TaskSpec] = TrainingSpec if JobKind(argv[0]) is JobKind.TRAIN else TaskSpec
    spec, folder = read_payload(argv[1], spec_class)
    try:
        spec, problem = preflight(spec)
        if problem:
            report_failure(spec, Failure(FailureClass.CONFIGURATION, problem), started_at)
            return 1
        print(banner(spec), flush=True)
        if isinstance(spec, TrainingSpec) and spec.script:
            from airflow_provider_horovod.runtime.script import connect_at_niceness_0

            connect_at_niceness_0()
        if isinstance(spec, TrainingSpec):
            record = run_training(spec, folder, started_at)
        else:
            record = run_task(spec, folder, started_at)
    except Exception as err:  # the job must end FAILED with a readable reason
        traceback.print_exc()
        report_failure(spec, failures.of_error(err, user_code=isinstance(spec, TaskSpec)), started_at)
        return 1
    except SystemExit:
        if stop_signalled():
            report_stop(spec, started_at)
        raise
    say(f"{marked(RESULT_MARK, spec.mark_token)}{record.to_json().replace(chr(10), '')}")
    if isinstance(spec, TrainingSpec):
        leave_ray()
    return 0


def leave_ray() -> None:
    """Disconnect from the cluster now that a training's record is written and printed: at exit, Ray's own
    hook first sleeps half a second for its tasks' last log lines, and a training's workers have all ended
    before ``fit()`` returned. The job ends, and its task with it, that much sooner."""
    import ray

    if ray.is_initialized():
        ray.shutdown()


def banner(spec: JobSpec) -> str:
    if isinstance(spec, TrainingSpec):
        return (
            f"airflow-provider-horovod: job {spec.submission_id}, attempt {spec.attempt}, {spec.num_workers} "
            f"Horovod workers ({'GPU' if spec.use_gpu else 'CPU'}), trainer {spec.trainer_api}, storage "
            f"{spec.run_uri}{', SMOKE RUN' if spec.smoke_run else ''}"
        )
    smoke = ", SMOKE RUN" if spec.smoke_run else ""
    return f"airflow-provider-horovod: task job {spec.submission_id}, attempt {spec.attempt}{smoke}"


def run_training(spec: TrainingSpec, folder: str, started_at: float) -> TaskRecord:
    from airflow_provider_horovod.runtime.trainers import run

    if not spec.tracking:
        record = run(spec, folder, started_at)
    else:  # the MLflow run around the training: only then is runtime.tracking (and MLflow) imported
        from airflow_provider_horovod.runtime import tracking

        spec = tracking.started(spec, folder)
        try:
            record = run(spec, folder, started_at)
        except BaseException:
            tracking.ended(spec, None)
            raise
        tracking.ended(
            spec, {"checkpoint_uri": record.checkpoint_uri, "best_checkpoint_uri": record.best_checkpoint_uri}
        )
    print(f"checkpoint: {record.checkpoint_uri}", flush=True)
    return record


def run_task(spec: TaskSpec, folder: str, started_at: float) -> TaskRecord:
    """Run the function in this driver, and write its return value (JSON) in the attempt's record."""
    from airflow_provider_horovod.runtime.payload import load_callable
    from airflow_provider_horovod.runtime.records import write_record
    from airflow_provider_horovod.runtime.uploads import route_uploads

    route_uploads()  # a checkpoint read with ray.train.Checkpoint comes down at S3's speed
    function = load_callable(spec.function, folder)
    value = function(*spec.args, **spec.kwargs)
    try:
        json.dumps(value)
    except (TypeError, ValueError) as err:
        raise TypeError(
            f"the function returned a {type(value).__name__}, which XCom cannot hold as JSON ({err}). "
            "Return numbers, strings, lists or dicts; write bigger objects to storage and return their "
            "URI."
        ) from None
    record = TaskRecord(
        submission_id=spec.submission_id,
        attempt=spec.attempt,
        storage_uri=spec.storage_uri,
        run_uri=spec.run_uri,
        return_value=value,
        timings=timings(started_at),
    )
    write_record(spec.result_uri, record)
    print(f"result: {spec.result_uri}", flush=True)
    return record


# --- before anything runs --------------------------------------------------------------------------


def preflight(spec: TrainingSpec | TaskSpec) -> tuple[TrainingSpec | TaskSpec, str | None]:
    """The spec to run here (a training's trainer API chosen for this Ray), and what keeps the job from
    running here with the fix; None when nothing does."""
    try:
        spec = with_trainer(spec) if isinstance(spec, TrainingSpec) else checked_ray(spec)
    except RayIncompatibleError as err:
        return spec, str(err)
    return spec, python_mismatch(spec.python_version, spec.pickled_files())


def checked_ray(spec: TaskSpec) -> TaskSpec:
    """A job that runs a function: any Ray of the range, or newer (with a warning)."""
    version = ray_compat.ray_version()
    if problem := check_ray_version(version):
        raise RayIncompatibleError(f"This Ray cluster cannot run the job: {problem}")
    if warning := untested_ray_version(version):
        print(f"WARNING: {warning}", flush=True)
    return spec


def with_trainer(spec: TrainingSpec) -> TrainingSpec:
    """The training spec with the trainer API this Ray runs it with (``ray_compat.choose_trainer``), the
    choice and any warning printed: the record and the XCom say the API that ran."""
    choice = ray_compat.choose_trainer(spec.trainer_api, spec.elastic)
    print(f"Trainer API: {choice.trainer_api} (trainer_api={spec.trainer_api!r}: {choice.why}).", flush=True)
    for warning in choice.warnings:
        print(f"WARNING: {warning}", flush=True)
    return dataclasses.replace(spec, trainer_api=choice.trainer_api)


def python_mismatch(airflow_python: str, pickled: dict[str, str]) -> str | None:
    """``pickled``: parameter -> payload file, for the functions that travelled pickled."""
    here = python_minor()
    if not pickled or not airflow_python or airflow_python == here:
        return None
    names = " and ".join(pickled)
    return (
        f"{names} travelled pickled by cloudpickle from Airflow's Python {airflow_python}, and pickled code loads "
        f"only on the same Python minor version; this Ray cluster runs Python {here}. Give {names} as an import "
        'path "package.module:function" (the module installed on the cluster, or shipped with runtime_env '
        "py_modules/working_dir), or run Airflow and the Ray cluster on the same Python minor version."
    )


# --- the one error line -----------------------------------------------------------------------------


def report_failure(spec: JobSpec, failure: Failure, started_at: float) -> None:
    """Say why the attempt failed, in the job's log and in the attempt's record beside its checkpoints."""
    say(f"{marked(ERROR_MARK, spec.mark_token)}{failure.failure_class.value}: {failure.summary}")
    say(failure.line(spec.mark_token))
    keep_failed_record(spec, failure, started_at)


def say(line: str) -> None:
    """A line the Airflow side reads, in one write: print() writes the text and its newline apart, and
    Ray's thread that forwards the actors' output to this driver wrote between them (seen: a line of
    the driver's traceback glued to one of the controller's; a verdict glued so is unreadable)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


# --- a stop ------------------------------------------------------------------------------------------

NO_NATIVE_SIGNAL_HANDLER_ENV = "RAY_DISABLE_FAILURE_SIGNAL_HANDLER"
# Ray stops a job by SIGTERM to its driver, and SIGKILL RAY_JOB_STOP_WAIT_TIME_S later (contract.JOB_STOP_WAIT_S).
STOPPED_MESSAGE = (
    "the job's driver got SIGTERM: the job was stopped (its task killed or marked failed, `ray job stop`, a "
    "timeout of the provider's) or its node shut down"
)


_signals: int | None = None  # the read end of the signals' wakeup pipe, once ``watch_for_stop`` ran


def watch_for_stop() -> None:
    """In the driver's main thread: SIGTERM unwinds it (SystemExit), as ray.init's own handler does once Ray
    is started, and is noted, whichever Python handler is set then (ray.get turns the exit into SystemExit(1),
    so its code cannot tell): Python writes every signal it handles to the wakeup pipe."""
    global _signals
    # Ray's native handler of SIGTERM (installed by ray.init) dumps the stack and ends the process 3 s later,
    # whatever Python does: off in this driver only (its workers keep theirs).
    os.environ.setdefault(NO_NATIVE_SIGNAL_HANDLER_ENV, "1")
    read, write = os.pipe()
    os.set_blocking(read, False)
    os.set_blocking(write, False)
    signal.set_wakeup_fd(write)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(signum))
    _signals = read


def stop_signalled() -> bool:
    """Whether the driver got SIGTERM (only known after ``watch_for_stop``)."""
    if _signals is None:
        return False
    try:
        return signal.SIGTERM in os.read(_signals, 4096)
    except BlockingIOError:  # nothing written
        return False


def report_stop(spec: JobSpec, started_at: float) -> None:
    """Keep the record of an attempt that Ray stopped, with the class the Airflow side gives a STOPPED job
    (``failures.of_job``), unless the attempt has one already (its result, its failure, the Airflow side's
    post-mortem); the one its stopper kept (``failures.kept_by_stopper``) is replaced, this one holding
    the timings and the metric history. No verdict line: the Airflow side decides as for a STOPPED job."""
    from airflow_provider_horovod.runtime.records import read_json

    try:
        there = read_json(spec.result_uri)
        if there is not None and not (isinstance(there, dict) and failures.kept_by_stopper(there)):
            return
    except Exception:  # the write below says what is wrong with the storage
        pass
    failure = failures.of_job({"status": JobStatus.STOPPED.value, "message": STOPPED_MESSAGE}, None)
    print(f"Stopped ({STOPPED_MESSAGE}); the attempt's record: {spec.result_uri}", flush=True)
    keep_failed_record(spec, failure, started_at)


def keep_failed_record(spec: JobSpec, failure: Failure, started_at: float) -> None:
    """The failed attempt's record beside its checkpoints: its class, timings and a training's metric history."""
    from airflow_provider_horovod.runtime.records import read_json, write_record

    fields: dict[str, Any] = {
        "submission_id": spec.submission_id,
        "attempt": spec.attempt,
        "storage_uri": spec.storage_uri,
        "run_uri": spec.run_uri,
        "timings": timings(started_at),
        "failure": failure.to_dict(),
    }
    try:
        if isinstance(spec, TrainingSpec):
            record: TaskRecord = ResultRecord(
                **fields,
                world_size=spec.min_workers,
                trainer_api=spec.trainer_api,
                history=read_json(spec.history_uri) or [],
            )
        else:
            record = TaskRecord(**fields)
        write_record(spec.result_uri, record)
    except Exception as err:  # the storage itself may be what failed; the log still says why
        print(f"The failed attempt's record could not be written to {spec.result_uri}: {err}", flush=True)


if __name__ == "__main__":
    watch_for_stop()
    sys.exit(main())
