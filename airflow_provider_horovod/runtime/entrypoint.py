"""The entrypoint of every job the provider submits:
``python -m airflow_provider_horovod.runtime.entrypoint train|task <payload module>``.

It reads the payload, checks that it can run here (the cluster's Ray, the Python of pickled code),
runs the training (``trainers.run``) or the function (in the job's driver, with the resources the
job asked for), writes the attempt's record and prints it as one ``AHP_RESULT`` line. On failure it
prints one ``AHP_ERROR`` line (what failed, and what to do) and exits 1, so the job ends FAILED and
the Airflow task says why.
"""

from __future__ import annotations

import json
import re
import sys
import time
import traceback

from airflow_provider_horovod.contract import (
    ERROR_MARK,
    RESULT_MARK,
    JobKind,
    JobSpec,
    TaskRecord,
    TaskSpec,
    TrainingSpec,
    check_ray_version,
)

WORKER_DIED_HINT = (
    "a training worker died (process killed, out of memory, or node lost). Raise max_failures to "
    "let Ray Train restart the workers from the last checkpoint, or give the workers more memory."
)
DIED_ERRORS = ("ActorDiedError", "RayActorError", "WorkerCrashedError", "ActorUnavailableError", "NodeDiedError",
               "WorkerHealthCheckFailedError")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    kinds = [kind.value for kind in JobKind]
    if len(argv) != 2 or argv[0] not in kinds:
        print(f"usage: python -m airflow_provider_horovod.runtime.entrypoint {'|'.join(kinds)} <payload module>",
              file=sys.stderr)
        return 2
    from airflow_provider_horovod.runtime.storage import read_payload

    started_at = time.time()
    spec: JobSpec
    spec, folder = read_payload(argv[1], TrainingSpec if JobKind(argv[0]) is JobKind.TRAIN else TaskSpec)
    if problem := preflight(spec):
        print(f"{ERROR_MARK}{problem}", flush=True)
        return 1
    print(banner(spec), flush=True)
    try:
        if isinstance(spec, TrainingSpec):
            record = run_training(spec, folder, started_at)
        else:
            assert isinstance(spec, TaskSpec)
            record = run_task(spec, folder, started_at)
    except Exception as err:  # the job must end FAILED with a readable reason
        traceback.print_exc()
        print(f"{ERROR_MARK}{describe(err)}", flush=True)
        return 1
    print(f"{RESULT_MARK}{record.to_json().replace(chr(10), '')}", flush=True)
    return 0


def banner(spec: JobSpec) -> str:
    if isinstance(spec, TrainingSpec):
        return (f"airflow-provider-horovod: job {spec.submission_id}, attempt {spec.attempt}, {spec.num_workers} "
                f"Horovod workers ({'GPU' if spec.use_gpu else 'CPU'}), trainer {spec.trainer_api}, storage "
                f"{spec.run_uri}")
    return f"airflow-provider-horovod: task job {spec.submission_id}, attempt {spec.attempt}"


def run_training(spec: TrainingSpec, folder: str, started_at: float) -> TaskRecord:
    from airflow_provider_horovod.runtime.trainers import run

    record = run(spec, folder, started_at)
    print(f"checkpoint: {record.checkpoint_uri}", flush=True)
    return record


def run_task(spec: TaskSpec, folder: str, started_at: float) -> TaskRecord:
    """Run the function in this driver, and write its return value (JSON) in the attempt's record."""
    from airflow_provider_horovod.runtime.storage import load_callable, route_uploads, write_record

    route_uploads()  # a checkpoint read with ray.train.Checkpoint comes down at S3's speed
    value = load_callable(spec.function, folder)(*spec.args, **spec.kwargs)
    try:
        json.dumps(value)
    except (TypeError, ValueError) as err:
        raise TypeError(f"the function returned a {type(value).__name__}, which XCom cannot hold as JSON ({err}). "
                        "Return numbers, strings, lists or dicts; write bigger objects to storage and return their "
                        "URI.") from None
    record = TaskRecord(submission_id=spec.submission_id, attempt=spec.attempt, storage_uri=spec.storage_uri,
                        run_uri=spec.run_uri, return_value=value,
                        timings={"started_at": started_at, "finished_at": time.time(),
                                 "total_s": round(time.time() - started_at, 3)})
    write_record(spec.result_uri, record)
    print(f"result: {spec.result_uri}", flush=True)
    return record


# --- before anything runs --------------------------------------------------------------------------

def preflight(spec: JobSpec) -> str | None:
    """What keeps the job from running here, and the fix; None when nothing does."""
    return ray_mismatch() or python_mismatch(spec.python_version, spec.pickled_files())


def ray_mismatch() -> str | None:
    import ray

    problem = check_ray_version(ray.__version__)
    return None if problem is None else f"This Ray cluster cannot run the job: {problem}"


def python_mismatch(airflow_python: str, pickled: dict[str, str]) -> str | None:
    """``pickled``: parameter -> payload file, for the functions that travelled pickled."""
    here = f"{sys.version_info[0]}.{sys.version_info[1]}"
    if not pickled or not airflow_python or airflow_python == here:
        return None
    names = " and ".join(pickled)
    return (f"{names} travelled pickled by cloudpickle from Airflow's Python {airflow_python}, and pickled code loads "
            f"only on the same Python minor version; this Ray cluster runs Python {here}. Give {names} as an import "
            'path "package.module:function" (the module installed on the cluster, or shipped with runtime_env '
            "py_modules/working_dir), or run Airflow and the Ray cluster on the same Python minor version.")


# --- the one error line ---------------------------------------------------------------------------

def error_chain(err: BaseException | None) -> list[BaseException]:
    """The error, its causes, and (Train V2) the errors of the workers behind a WorkerGroupError."""
    chain: list[BaseException] = []
    todo, seen = [err], set()
    while todo:
        err = todo.pop(0)
        if err is None or id(err) in seen:
            continue
        seen.add(id(err))
        chain.append(err)
        todo += [err.__cause__ or err.__context__, *(getattr(err, "worker_failures", None) or {}).values()]
    return chain


def summary(err: BaseException) -> str:
    """The first line of an error's message; for an actor that failed in its constructor (Ray
    Train's controller when the storage cannot be reached, say), also the constructor's own error,
    which Ray puts on the message's last line."""
    lines = [line for line in re.sub(r"\x1b\[[0-9;]*m", "", str(err)).strip().splitlines() if line.strip()]
    if not lines:
        return ""
    if getattr(err, "actor_init_failed", False) and len(lines) > 1:
        return f"{lines[0].strip()} ... {lines[-1].strip()}"
    return lines[0].strip()


def describe(err: BaseException) -> str:
    """One line for the task log: the error type, its message, and a hint when a worker died."""
    chain = error_chain(err)
    text = " <- ".join(f"{type(e).__name__}: {summary(e)}" for e in chain)
    # Train V1 wraps the death in a class named like "RayTaskError(ActorDiedError)". An actor whose
    # constructor raised did not die under load: its own error says what is wrong.
    died = any(name in DIED_ERRORS for e in chain if not getattr(e, "actor_init_failed", False)
               for name in re.findall(r"\w+", type(e).__name__))
    return f"{text} -- {WORKER_DIED_HINT}" if died else text


if __name__ == "__main__":
    sys.exit(main())
