"""The other script a user writes without the operator: ``bench.train_script`` (its arguments handed on) as a plain
Ray job, polled every second. Prints one ``AHP_BENCH_SUBMIT {json}`` line: the id, and submission to seen ended."""

from __future__ import annotations

import json
import os
import shlex
import sys
import time

from bench.train_script import parser

SUBMIT_TAG = "AHP_BENCH_SUBMIT"
POLL_S = 1.0


def main() -> int:
    argv = sys.argv[1:]
    name = parser().parse_args(argv).name
    from ray.job_submission import JobStatus, JobSubmissionClient

    from airflow_provider_horovod.local import ensure_running

    cluster = ensure_running()  # the running embedded cluster: its URL and token
    bench_dir = os.path.dirname(os.path.abspath(__file__))
    started = time.monotonic()
    client = JobSubmissionClient(cluster.dashboard_url, headers={"Authorization": f"Bearer {cluster.token}"})
    submission_id = client.submit_job(
        entrypoint=f"python -m bench.train_script {shlex.join(argv)}",
        # The bench package travels with the job, as the provider travels with its jobs.
        runtime_env={
            "py_modules": [bench_dir],
            "excludes": ["out", "__pycache__"],
            "env_vars": {"RAY_ADDRESS": os.environ.get("BENCH_RAY_ADDRESS", "")},
        },
        metadata={"bench": "plain-job", "name": name},
    )
    while not (status := client.get_job_status(submission_id)).is_terminal():
        time.sleep(POLL_S)
    wall = time.monotonic() - started
    found = {"submission_id": submission_id, "status": str(status.value), "submit_to_done_s": wall}
    print(f"{SUBMIT_TAG} {json.dumps({**found, 'done_at': time.time()})}", flush=True)
    return 0 if status == JobStatus.SUCCEEDED else 1


if __name__ == "__main__":
    sys.exit(main())
