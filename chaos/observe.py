"""What `make chaos` sees of the deployment while it runs and once it drained, as plain data for the
checks (chaos/checks.py):

- while it runs, every few seconds (``Observer``): the Ray jobs the head lists (tagged with the head
  they ran on: a replaced head forgets its jobs), the task instances Airflow lists, and the champion's
  log in S3;
- at the end (``collect``): every DAG run, task instance and try, the task logs, the XComs, the Ray
  jobs' logs and every attempt's record in S3.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import httpx

from chaos import schedule
from chaos.deployment import BUCKET, STORAGE, Deployment

POLL_S = 3.0
TERMINAL_JOB = {"SUCCEEDED", "FAILED", "STOPPED"}
# The training tasks of the workload (their Ray jobs train; the others' are @task.ray jobs).
TRAINING_TASKS = {(schedule.RETRAINING, "train"), (schedule.SWEEP, "train"), (schedule.ELASTIC, "train")}
CHAMPION_KEY = "runs/chaos_retraining/champion.json"


def ti_key(dag_id: str, task_id: str, run_id: str, map_index: int | str | None) -> str:
    """One key per task instance, as the checks name it."""
    index = -1 if map_index in (None, "") else int(map_index)
    return f"{dag_id}/{task_id}/{run_id}/{index}"


def job_ti_key(job: dict) -> str | None:
    meta = job.get("metadata") or {}
    if "airflow_dag_id" not in meta:
        return None
    return ti_key(meta["airflow_dag_id"], meta["airflow_task_id"], meta["airflow_run_id"], meta["airflow_map_index"])


class Observer:
    """Polls the deployment in a thread of its own until ``stop()``; what it saw stays on it."""

    def __init__(self, deployment: Deployment) -> None:
        self.deployment = deployment
        self.started = time.monotonic()
        self.started_wall = time.time()  # the same moment, to place the components' log lines
        # (head epoch, submission id) -> the job as last listed, with "first_seen_s"/"last_seen_s".
        self.jobs: dict[tuple[int, str], dict] = {}
        # Each poll of the jobs: (t, head epoch, [(submission id, status)] of the unended ones).
        self.job_polls: list[tuple[float, int, list[tuple[str, str]]]] = []
        # Each poll of Airflow: (t, {ti key: state}).
        self.ti_polls: list[tuple[float, dict[str, str]]] = []
        self.tis: dict[str, dict] = {}  # the latest listing of every task instance
        # Each task instance's tries as they were seen to change: (t, try number, host name).
        self.ti_tries: dict[str, list[tuple[float, int, str]]] = {}
        # The champion's log each time it changed: (t, record).
        self.champion: list[tuple[float, dict]] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-observer", daemon=True)
        self._ray = httpx.Client(timeout=5, headers={"Authorization": f"Bearer {deployment.ray_token}"})

    def now(self) -> float:
        return round(time.monotonic() - self.started, 2)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        while not self._stop.wait(POLL_S):
            for poll in (self.poll_jobs, self.poll_tis, self.poll_champion):
                try:
                    poll()
                except Exception as err:  # noqa: BLE001 - a fault may make any of them fail for a while
                    if len(self.errors) < 200:
                        self.errors.append(f"{self.now()} {poll.__name__}: {type(err).__name__}: {err}")

    def list_jobs(self) -> list[dict]:
        response = self._ray.get(f"{self.deployment.dashboard_url}/api/jobs/")
        response.raise_for_status()
        return response.json()

    def poll_jobs(self) -> None:
        epoch = self.deployment.head_epoch
        listed = self.list_jobs()
        if epoch != self.deployment.head_epoch:
            return  # the head was replaced during the request: which one answered is not known
        t = self.now()
        unended = []
        for job in listed:
            sid = job.get("submission_id")
            if not sid:
                continue
            seen = self.jobs.get((epoch, sid))
            ended = job.get("status") in TERMINAL_JOB
            self.jobs[(epoch, sid)] = {
                **job,
                "head_epoch": epoch,
                "first_seen_s": seen["first_seen_s"] if seen else t,
                "last_seen_s": t,
                # The first poll that saw it ended (None while it runs).
                "ended_s": (seen or {}).get("ended_s") or (t if ended else None),
            }
            if job.get("status") not in TERMINAL_JOB:
                unended.append((sid, job.get("status")))
        self.job_polls.append((t, epoch, sorted(unended)))

    def list_tis(self) -> list[dict]:
        stack = self.deployment.stack
        assert stack is not None
        found: list[dict] = []
        while True:
            page = stack.api("GET", "/dags/~/dagRuns/~/taskInstances", params={"limit": 1000, "offset": len(found)})
            found += page["task_instances"]
            if not page["task_instances"] or len(found) >= page["total_entries"]:
                return found

    def poll_tis(self) -> None:
        listed = self.list_tis()
        t = self.now()
        states = {}
        for ti in listed:
            key = ti_key(ti["dag_id"], ti["task_id"], ti["dag_run_id"], ti.get("map_index"))
            states[key] = ti.get("state") or "none"
            self.tis[key] = ti
            tries = self.ti_tries.setdefault(key, [])
            seen = (int(ti.get("try_number") or 0), ti.get("hostname") or "")
            if not tries or tries[-1][1:] != seen:
                tries.append((t, *seen))
        self.ti_polls.append((t, states))

    def poll_champion(self) -> None:
        client = self.deployment.s3_client()
        try:
            body = client.get_object(Bucket=BUCKET, Key=CHAMPION_KEY)["Body"].read()
        except client.exceptions.NoSuchKey:
            return
        record = json.loads(body)
        if not self.champion or self.champion[-1][1] != record:
            self.champion.append((self.now(), record))

    def running_trainings(self, states: tuple[str, ...] = ("running", "deferred")) -> list[dict]:
        """The training task instances in one of ``states`` at the last look, in a stable order."""
        return sorted(
            (
                ti
                for ti in list(self.tis.values())
                if (ti["dag_id"], ti["task_id"]) in TRAINING_TASKS and ti.get("state") in states
            ),
            key=lambda ti: ti["id"],
        )

    def to_dict(self) -> dict:
        return {
            "jobs": [self.jobs[key] for key in sorted(self.jobs)],
            "job_polls": self.job_polls,
            "ti_polls": self.ti_polls,
            "ti_tries": self.ti_tries,
            "champion": self.champion,
            "errors": self.errors,
        }


# --- once it drained ------------------------------------------------------------------------------


def collect(deployment: Deployment, observer: Observer, dag_ids: tuple[str, ...]) -> dict[str, Any]:
    """Everything the checks read, from Airflow (runs, task instances, their logs, XComs), Ray (the jobs
    of the head now, their logs) and S3 (every attempt's record)."""
    stack = deployment.stack
    assert stack is not None
    runs = []
    for dag_id in dag_ids:
        runs += stack.api("GET", f"/dags/{dag_id}/dagRuns", params={"limit": 1000})["dag_runs"]
    tis = observer.list_tis()
    logs: dict[str, list[list[dict]]] = {}
    xcoms: dict[str, dict[str, Any]] = {}
    for ti in tis:
        key = ti_key(ti["dag_id"], ti["task_id"], ti["dag_run_id"], ti.get("map_index"))
        base = f"/dags/{ti['dag_id']}/dagRuns/{ti['dag_run_id']}/taskInstances/{ti['task_id']}"
        index = ti.get("map_index", -1)
        logs[key] = [task_log(stack, ti, number) for number in range(1, int(ti.get("try_number") or 0) + 1)]
        xcoms[key] = ti_xcoms(stack, base, index)
    jobs_now = observer.list_jobs()
    job_logs = {}
    for job in jobs_now:
        sid = job.get("submission_id")
        if sid and (job.get("metadata") or {}).get("airflow_dag_id"):
            response = observer._ray.get(f"{deployment.dashboard_url}/api/jobs/{sid}/logs", timeout=30)
            if response.status_code == 200:
                job_logs[sid] = response.json().get("logs", "")
    return {
        "runs": runs,
        "tis": tis,
        "logs": logs,
        "xcoms": xcoms,
        "jobs_now": jobs_now,
        "job_logs": job_logs,
        "records": attempt_records(deployment),
        "head_epoch": deployment.head_epoch,
    }


def task_log(stack, ti: dict, try_number: int) -> list[dict]:
    """One try's log as Airflow serves it (records), [] when there is none."""
    path = f"/api/v2/dags/{ti['dag_id']}/dagRuns/{ti['dag_run_id']}/taskInstances/{ti['task_id']}/logs/{try_number}"
    try:
        response = stack.client.get(path, params={"full_content": True, "map_index": ti.get("map_index", -1)})
    except httpx.HTTPError:
        return []
    if response.status_code != 200:
        return []
    content = response.json().get("content") or []
    return [entry if isinstance(entry, dict) else {"event": str(entry)} for entry in content]


def ti_xcoms(stack, base: str, map_index: int) -> dict[str, Any]:
    try:
        entries = stack.api("GET", f"{base}/xcomEntries", params={"map_index": map_index, "limit": 100})
    except httpx.HTTPError:
        return {}
    found = {}
    for entry in entries.get("xcom_entries", []):
        try:
            found[entry["key"]] = stack.api(
                "GET",
                f"{base}/xcomEntries/{entry['key']}",
                params={"map_index": map_index, "deserialize": True, "stringify": False},
            )["value"]
        except httpx.HTTPError as err:
            found[entry["key"]] = f"<unreadable: {err}>"
    return found


def attempt_records(deployment: Deployment) -> dict[str, dict]:
    """Every ``attempt-N/result.json`` under the storage, by its URI (an unreadable one as an error)."""
    client = deployment.s3_client()
    prefix = STORAGE.split(f"s3://{BUCKET}/", 1)[1] + "/"
    records = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
        for item in page.get("Contents", []):
            key = item["Key"]
            if not key.endswith("/result.json") or not key.rsplit("/", 2)[-2].startswith("attempt-"):
                continue
            try:
                records[f"s3://{BUCKET}/{key}"] = json.loads(client.get_object(Bucket=BUCKET, Key=key)["Body"].read())
            except Exception as err:  # noqa: BLE001 - a record that does not parse is itself a finding
                records[f"s3://{BUCKET}/{key}"] = {"unreadable": f"{type(err).__name__}: {err}"}
    return records
