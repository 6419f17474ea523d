"""Airflow as deployed: the api-server, scheduler, dag-processor and triggerer as separate processes
(LocalExecutor, PostgreSQL, the simple auth manager), driven through the REST API.

    stack = Stack(home, dags_folder, port, database_url=postgres.create_database("stack", template=...))
    stack.start(); run_id = stack.trigger("my_dag"); stack.wait_for_state(...)

    with deployment(folder, dags_folder, dag_ids=("my_dag",)) as stack:   # its own PostgreSQL too
        ...

The Airflow of the environment that runs this (``sys.executable``'s ``airflow``) is the deployment's.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from harness.ports import free_port
from harness.postgres import Postgres
from harness.tasks import HUNG_S

COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")
REST_TIMEOUT_S = 120


def airflow_bin() -> str:
    """The ``airflow`` command of the environment this runs in."""
    return str(Path(sys.executable).with_name("airflow"))


class Stack:
    """``path``: the sub-path the deployment is served under (``[api] base_url``), "" for none; a second
    api-server of a deployment is a ``Stack`` on its ``database_url`` that only ``serve``s."""

    def __init__(
        self, home: Path, dags: Path, port: int, database_url: str, env: dict | None = None, *, path: str = ""
    ):
        self.home, self.port, self.database_url = home, port, database_url
        self.url = f"http://127.0.0.1:{port}{path}"
        self.env = {
            **os.environ,
            **(env or {}),
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": database_url,
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
            "AIRFLOW__API__BASE_URL": self.url,
            "AIRFLOW__API__PORT": str(port),
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.url}/execution/",
            # HS512's 64 bytes at least: PyJWT warns below (InsecureKeyLengthWarning).
            "AIRFLOW__API_AUTH__JWT_SECRET": "ahp-stack-test-secret-" * 3,
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
            # The DAG files do not change while a stack runs: parsed once, not again and again as Airflow's
            # default does, which takes CPU, idle, from the two cores the tests need.
            "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "600",
            "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "1",
            "AIRFLOW__CORE__PARALLELISM": "4",
            # A task's calls to the Execution API (its start first) have a short timeout by default: on a
            # loaded machine (make test beside another heavy run) the api-server took longer, and the
            # worker killed the task before it ran. Airflow's advice under high load.
            "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": "30",
        }
        self.processes: dict[str, subprocess.Popen] = {}
        self.logs = home / "component-logs"

    def migrate(self) -> None:
        """``airflow db migrate`` on the stack's database."""
        subprocess.run([airflow_bin(), "db", "migrate"], env=self.env, check=True, capture_output=True, timeout=300)

    def start(self, timeout: float = 180, migrated: bool = False) -> None:
        """Start the components; ``migrated``: the database is already migrated (a copy of one that was)."""
        self.home.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(exist_ok=True)
        if not migrated:
            self.migrate()
        for name in COMPONENTS:
            self.launch(name)
        self.wait_until_served(timeout)

    def serve(self, timeout: float = 180) -> None:
        """Only an api-server, on a database that another stack runs."""
        self.home.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(exist_ok=True)
        self.launch("api-server")
        self.wait_until_served(timeout)

    def wait_until_served(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/api/v2/monitor/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        else:
            raise RuntimeError(f"the api-server did not answer: {self.log_tail('api-server')}")
        # The tests check states and results, not how fast the api-server answers: beside another heavy run
        # one REST call can take longer than a client's usual timeout.
        self.client = httpx.Client(
            base_url=self.url, timeout=REST_TIMEOUT_S, headers={"Authorization": f"Bearer {self.token()}"}
        )

    def launch(self, name: str) -> None:
        args = [airflow_bin(), name] + (["--port", str(self.port)] if name == "api-server" else [])
        log = open(self.logs / f"{name}.log", "ab")
        self.processes[name] = subprocess.Popen(
            args, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def restart(self, name: str) -> None:
        """Stop a component as a deployment's restart does (SIGTERM, then SIGKILL), and start it again."""
        self.terminate(name)
        self.launch(name)

    def terminate(self, name: str) -> None:
        process = self.processes.pop(name)
        try:
            os.killpg(process.pid, signal.SIGTERM)
        except ProcessLookupError:  # it exited on its own first: nothing is left to stop
            process.wait()
            return
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)

    def stop(self) -> None:
        for name in list(self.processes):
            self.terminate(name)

    def token(self) -> str:
        return httpx.get(f"{self.url}/auth/token", timeout=REST_TIMEOUT_S).json()["access_token"]

    def log_tail(self, name: str, chars: int = 3000) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def api(self, method: str, path: str, **kwargs) -> dict:
        response = self.client.request(method, f"/api/v2{path}", **kwargs)
        response.raise_for_status()
        return response.json() if response.content else {}

    def wait_for_dag(self, dag_id: str, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.client.get(f"/api/v2/dags/{dag_id}").status_code == 200:
                self.api("PATCH", f"/dags/{dag_id}", json={"is_paused": False})
                return
            time.sleep(2)
        raise RuntimeError(f"{dag_id} was never parsed: {self.log_tail('dag-processor')}")

    def trigger(self, dag_id: str, conf: dict | None = None) -> str:
        """A run without a logical date (as the UI's trigger button makes one)."""
        return self.api("POST", f"/dags/{dag_id}/dagRuns", json={"logical_date": None, "conf": conf or {}})[
            "dag_run_id"
        ]

    def mark(self, dag_id: str, run_id: str, task_id: str, state: str) -> None:
        """Set a task instance's state as a user does in the UI (a running one is killed)."""
        path = f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}"
        self.client.patch(path, json={"new_state": state}).raise_for_status()

    def wait_for_trigger(self, dag_id: str, run_id: str, task_id: str, timeout: float = HUNG_S) -> None:
        """Until the triggerer runs the task's trigger (its start is in the task's log)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            records = self.task_log(dag_id, run_id, task_id)
            if any(re.match(r"trigger .* starting", str(r.get("event", ""))) for r in records):
                return
            time.sleep(0.5)
        raise AssertionError(f"the triggerer never ran {dag_id}.{task_id}'s trigger: {self.log_tail('triggerer')}")

    def task_instance(self, dag_id: str, run_id: str, task_id: str) -> dict:
        return self.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}")

    def wait_for_state(
        self, dag_id: str, run_id: str, task_id: str, states: set[str], timeout: float = HUNG_S, every: float = 1.0
    ) -> dict:
        """``every``: seconds between asks (each costs the api-server and the database CPU beside the task)."""
        deadline = time.monotonic() + timeout
        ti = {}
        while time.monotonic() < deadline:
            ti = self.task_instance(dag_id, run_id, task_id)
            if ti.get("state") in states:
                return ti
            time.sleep(every)
        raise AssertionError(
            f"{dag_id}.{task_id} never reached {states}: {ti.get('state')}\n"
            f"{self.log_tail('scheduler')}\n{self.log_tail('triggerer')}"
        )

    def config(self, section: str, key: str) -> str:
        """A setting as the deployment's Airflow reads it (its own config parser)."""
        done = subprocess.run(
            [airflow_bin(), "config", "get-value", section, key],
            env=self.env,
            check=True,
            capture_output=True,
            text=True,
            timeout=120,
        )
        return done.stdout.strip()

    def xcom(self, dag_id: str, run_id: str, task_id: str, key: str = "return_value"):
        entry = self.api(
            "GET",
            f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/xcomEntries/{key}",
            params={"deserialize": True, "stringify": False},
        )
        return entry["value"]

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int = 1) -> list[dict]:
        """The task's log as Airflow serves it: one dict per record (``event``, ``level``, ...)."""
        response = self.client.get(
            f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/logs/{try_number}",
            params={"full_content": True},
        )
        if response.status_code == 404:
            return []
        response.raise_for_status()
        content = response.json().get("content") or []
        return [entry if isinstance(entry, dict) else {"event": str(entry)} for entry in content]


@contextlib.contextmanager
def deployment(folder: Path, dags: Path, *, env: dict | None = None, dag_ids: tuple[str, ...] = ()) -> Iterator[Stack]:
    """A deployment of its own under ``folder``: a PostgreSQL server and Airflow's components on it, the
    DAGs of ``dag_ids`` parsed and unpaused; stopped and removed on leaving, also on error."""
    postgres = Postgres(folder / "postgres").start()
    stack = Stack(folder / "airflow", dags, free_port(), database_url=postgres.create_database("airflow"), env=env)
    try:
        stack.start()
        for dag_id in dag_ids:
            stack.wait_for_dag(dag_id)
        yield stack
    finally:
        stack.stop()
        postgres.remove()
