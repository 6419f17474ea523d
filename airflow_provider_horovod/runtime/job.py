"""Entrypoint of the Ray job: ``python -m airflow_provider_horovod.runtime.job <payload module>``.

Prints a banner, trains, writes the result record and prints it as one ``AHP_RESULT`` line. On
failure it prints one ``AHP_ERROR`` line (the error type and what to do) and exits 1, so the job
ends FAILED and the Airflow task shows why.
"""

from __future__ import annotations

import re
import sys
import time
import traceback

WORKER_DIED_HINT = (
    "a training worker died (process killed, out of memory, or node lost). Raise max_failures to "
    "let Ray Train restart the workers from the last checkpoint, or give the workers more memory."
)


DIED_ERRORS = ("ActorDiedError", "RayActorError", "WorkerCrashedError", "ActorUnavailableError", "NodeDiedError",
               "WorkerHealthCheckFailedError")


def error_chain(err: BaseException | None) -> list[BaseException]:
    """The error, its causes, and (Train V2) the errors of the workers behind a WorkerGroupError."""
    chain, todo, seen = [], [err], set()
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


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m airflow_provider_horovod.runtime.job <payload module>", file=sys.stderr)
        return 2
    started_at = time.time()
    from airflow_provider_horovod.runtime.payload import read_payload
    from airflow_provider_horovod.runtime.preflight import problems
    from airflow_provider_horovod.spec import TrainingSpec

    spec, folder = read_payload(argv[0], TrainingSpec)
    if problem := problems(spec):
        print(f"AHP_ERROR {problem}", flush=True)
        return 1
    print(
        f"airflow-provider-horovod: job {spec.submission_id}, attempt {spec.attempt}, "
        f"{spec.num_workers} Horovod workers ({'GPU' if spec.use_gpu else 'CPU'}), trainer {spec.trainer_api}, "
        f"storage {spec.run_uri}",
        flush=True,
    )
    from airflow_provider_horovod.runtime.trainers import run

    try:
        record = run(spec, folder, started_at)
    except Exception as err:  # the job must end FAILED with a readable reason
        traceback.print_exc()
        print(f"AHP_ERROR {describe(err)}", flush=True)
        return 1
    print(f"AHP_RESULT {record.to_json().replace(chr(10), '')}", flush=True)
    print(f"checkpoint: {record.checkpoint_uri}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
