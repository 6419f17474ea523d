"""Entrypoint of a task job (``RayTaskOperator``, ``@task.ray``):
``python -m airflow_provider_horovod.runtime.task <payload module>``.

Runs the function in the job's driver, with the resources the job asked for (CPUs, GPUs, memory),
and writes its return value (JSON) in the attempt's record, which the Airflow side pushes to XCom.
On failure it prints one ``AHP_ERROR`` line and exits 1, so the job ends FAILED saying why.
"""

from __future__ import annotations

import json
import sys
import time
import traceback


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m airflow_provider_horovod.runtime.task <payload module>", file=sys.stderr)
        return 2
    started_at = time.time()
    from airflow_provider_horovod.runtime.job import describe
    from airflow_provider_horovod.runtime.payload import load_callable, read_payload
    from airflow_provider_horovod.runtime.preflight import problems
    from airflow_provider_horovod.runtime.result import write_record
    from airflow_provider_horovod.spec import TaskRecord, TaskSpec

    spec, folder = read_payload(argv[0], TaskSpec)
    if problem := problems(spec):
        print(f"AHP_ERROR {problem}", flush=True)
        return 1
    print(f"airflow-provider-horovod: task job {spec.submission_id}, attempt {spec.attempt}", flush=True)
    from airflow_provider_horovod.runtime import checkpoint_io

    checkpoint_io.install()  # a checkpoint read with ray.train.Checkpoint comes down at S3's speed
    try:
        value = load_callable(spec.function, folder)(*spec.args, **spec.kwargs)
    except Exception as err:  # the job must end FAILED with a readable reason
        traceback.print_exc()
        print(f"AHP_ERROR {describe(err)}", flush=True)
        return 1
    try:
        json.dumps(value)
    except (TypeError, ValueError) as err:
        print(f"AHP_ERROR the function returned a {type(value).__name__}, which XCom cannot hold as JSON ({err}). "
              "Return numbers, strings, lists or dicts; write bigger objects to storage and return their URI.",
              flush=True)
        return 1
    record = TaskRecord(submission_id=spec.submission_id, attempt=spec.attempt, storage_uri=spec.storage_uri,
                        run_uri=spec.run_uri, return_value=value,
                        timings={"started_at": started_at, "finished_at": time.time(),
                                 "total_s": round(time.time() - started_at, 3)})
    write_record(spec.result_uri, record)
    print(f"result: {spec.result_uri}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
