"""The deployment `make chaos` runs against, as users run one, on this machine:

- two hosts made of network namespaces (``harness/hosts.py``, Debian's /etc/hosts): a Ray head with
  token auth on host 1, a Ray worker node on host 2, 3 CPUs each (the machine has 2 cores; the
  workload is sized so);
- S3 (moto's server, in this process) behind a gate on the root namespace's address of the hosts'
  network, reached by Airflow and by the Ray nodes with keys of their own; closing the gate refuses new
  connections and cuts the open ones, while the buckets stay;
- PostgreSQL (Debian's server, ``harness/postgres.py``) holding Airflow's metadata;
- Airflow's api-server, scheduler, dag-processor and triggerer as separate processes with the
  LocalExecutor (``harness/stack.py``), the provider installed from its wheel, the workload's DAGs
  from ``chaos/dags``, the Ray and AWS connections in their environment.

It can also break and mend itself: kill a host's processes and bring its Ray node back, replace the
Ray head, make S3 refuse connections, restart an Airflow component. ``down()`` removes everything.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import threading
import time
from pathlib import Path

from harness import hosts as hostlib
from harness.cluster import connection
from harness.ports import free_port
from harness.processes import cmdline, pids
from harness.s3 import MotoServer
from harness.stack import Stack, deployment

REPO = Path(__file__).resolve().parents[1]
DAGS = REPO / "chaos" / "dags"
SUBNET = "10.80.0"  # apart from the tests' hosts (10.77.0, 10.78.0) and figure 9's (10.79.0)
BUCKET = "chaos"
STORAGE = f"s3://{BUCKET}/runs"
CPUS_PER_HOST = 3
POOL, POOL_SLOTS = "chaos_training", 3


class Deployment:
    """Everything a run needs, started by ``up()`` and removed by ``down()``. ``out``: its folder."""

    name = "single"  # CHAOS_DEPLOYMENT's value for it
    executor = "LocalExecutor"
    dags = DAGS

    def __init__(self, out: Path) -> None:
        self.out = out
        self.hosts = hostlib.Hosts(2, etc_hosts=hostlib.DEBIAN, subnet=SUBNET)
        # Keys of this run's own (moto takes any): secrets the checks look for in every log, XCom and job info.
        self.aws = {
            "AWS_ACCESS_KEY_ID": "AKIA" + secrets.token_hex(8).upper(),
            "AWS_SECRET_ACCESS_KEY": secrets.token_urlsafe(30),
            "AWS_DEFAULT_REGION": "us-east-1",
        }
        self.s3: MotoServer | None = None
        self.gate: Gate | None = None
        self.s3_port = 0
        self.airflow = contextlib.ExitStack()  # PostgreSQL and Airflow's components, stopped as one
        self.stack: Stack | None = None
        # Cluster changes (a host lost, the head replaced) one at a time.
        self.topology = threading.Lock()
        self.head_epoch = 0  # how many times the head was replaced
        # Components a service manager started again after they exited on their own (none here: run.mend
        # starts what ended, once the faults are over; the spread deployment has one).
        self.restarted: list[dict] = []

    # --- up and down -----------------------------------------------------------------------------

    def host_roles(self) -> dict[str, str]:
        """What runs where, by host name (the root namespace is this machine's own)."""
        return {
            self.hosts[0].name: "Ray head",
            self.hosts[1].name: "Ray worker node",
            "root namespace": "Airflow's four components (LocalExecutor), PostgreSQL, S3 (moto)",
        }

    def up(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        self.start_s3_and_ray()
        self.stack = self.airflow.enter_context(deployment(self.out, DAGS, env=self.airflow_env()))
        self.create_pool()

    def start_s3_and_ray(self) -> None:
        self.hosts.up()
        self.s3 = MotoServer().start()
        self.s3_port = free_port(self.hosts.root_address)
        self.gate = Gate((self.hosts.root_address, self.s3_port), ("127.0.0.1", self.s3.port))
        self.gate.open()
        self.hosts.extra_env.update(self.s3_env())  # the Ray nodes' own access to S3
        self.s3_client().create_bucket(Bucket=BUCKET)
        self.hosts.start_head(num_cpus=CPUS_PER_HOST)
        self.hosts.join(self.hosts[1], num_cpus=CPUS_PER_HOST)
        self.hosts.wait_for_nodes(2, timeout=120)

    def pools(self) -> dict[str, int]:
        """The workload's Airflow pools and their slots (chaos/dags/chaos_dags.py names them)."""
        return {POOL: POOL_SLOTS}

    def create_pool(self) -> None:
        assert self.stack is not None
        for name, slots in self.pools().items():
            self.stack.api("POST", "/pools", json={"name": name, "slots": slots, "include_deferred": True})

    def down(self) -> None:
        """Every part, whatever state it is in (safe after a failed ``up``)."""
        for step in (
            self.airflow.close,
            self.keep_ray_logs,
            self.hosts.down,
            lambda: self.gate and self.gate.close(),
            lambda: self.s3 and self.s3.stop(),
        ):
            try:
                step()
            except Exception as err:  # noqa: BLE001 - the next part must still go
                print(f"[chaos] cleaning up: {type(err).__name__}: {err}", flush=True)

    # --- what clients need ---------------------------------------------------------------------------

    @property
    def s3_endpoint(self) -> str:
        return f"http://{self.hosts.root_address}:{self.s3_port}"

    def s3_env(self) -> dict[str, str]:
        return {"AWS_ENDPOINT_URL": self.s3_endpoint, **self.aws, "AWS_EC2_METADATA_DISABLED": "true"}

    def s3_client(self):
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.s3_endpoint,
            region_name=self.aws["AWS_DEFAULT_REGION"],
            aws_access_key_id=self.aws["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=self.aws["AWS_SECRET_ACCESS_KEY"],
            config=Config(connect_timeout=3, read_timeout=10, retries={"max_attempts": 1}),
        )

    @property
    def ray_token(self) -> str:
        return self.hosts.token

    @property
    def dashboard_url(self) -> str:
        return self.hosts.dashboard_url

    def secrets(self) -> dict[str, str]:
        """What must never show in a log, an XCom or a job's info."""
        return {"ray token": self.ray_token, "AWS secret key": self.aws["AWS_SECRET_ACCESS_KEY"]}

    def airflow_env(self) -> dict[str, str]:
        head = {"dashboard_url": self.dashboard_url, "token": self.ray_token}
        aws = {
            "conn_type": "aws",
            "login": self.aws["AWS_ACCESS_KEY_ID"],
            "password": self.aws["AWS_SECRET_ACCESS_KEY"],
            "extra": {"endpoint_url": self.s3_endpoint, "region_name": self.aws["AWS_DEFAULT_REGION"]},
        }
        return {
            # RAY_ADDRESS: Train V2's placement-group cleaner must find this cluster, not another on the machine.
            "AIRFLOW_CONN_RAY_DEFAULT": connection(
                head,
                shared_storage=False,
                extra={"runtime_env": {"env_vars": {"RAY_ADDRESS": self.hosts.gcs_address}}},
            ),
            "AIRFLOW_CONN_AWS_DEFAULT": json.dumps(aws),
            "CHAOS_STORAGE": STORAGE,
            # The chaos's trainings last 20-40 s: deferred after 15 s, the triggerer's faults meet them.
            "AIRFLOW__HOROVOD__DEFER_AFTER_SECONDS": "15",
            "AIRFLOW__CORE__PARALLELISM": "12",
            "AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG": "12",
            "AIRFLOW__API__MAXIMUM_PAGE_LIMIT": "1000",
        }

    def recovery_s(self) -> dict[str, float]:
        """How long Airflow itself lets a task stay in each state before it recovers it, as the deployment's
        Airflow reads its settings: a queued task is queued again, a running one whose process stopped
        heartbeating is failed (and retried), a deferred one's trigger is taken up by a live triggerer."""
        assert self.stack is not None
        heartbeat = float(self.stack.config("scheduler", "task_instance_heartbeat_timeout"))
        return {
            "queued": float(self.stack.config("scheduler", "task_queued_timeout")),
            "running": heartbeat,
            "deferred": max(heartbeat, float(self.stack.config("triggerer", "triggerer_health_check_threshold"))),
        }

    def mend_extras(self) -> list[str]:
        """After the last fault, what a deployment of its own must mend besides S3, the Ray nodes and
        Airflow's components (run.mend does those); what it mended."""
        return []

    # --- faults ------------------------------------------------------------------------------------

    def lose_host(self) -> None:
        """Host 2 as if its machine lost power: every process of it SIGKILLed at once."""
        self.hosts.stop_ray(self.hosts[1])

    def bring_back_host(self) -> None:
        """Host 2's Ray node started again (as the machine's boot would), once the head answers."""
        self.hosts.join(self.hosts[1], num_cpus=CPUS_PER_HOST)

    def stop_head(self) -> None:
        """Every process of host 1 (the head, its dashboard, the drivers of the jobs) SIGKILLed at once.
        Whatever answers from now on is another head: the epoch moves here, not once the new head and its
        worker node are up (the new dashboard answers, and takes jobs, well before that)."""
        self.hosts.stop_ray(self.hosts[0])
        self.head_epoch += 1

    def start_head(self) -> None:
        """A new head on host 1 (same address and token), and host 2's node joined to it: a worker node
        whose head went away ends itself after a while, so it is replaced at once, as an operator would."""
        self.hosts.stop_ray(self.hosts[1])
        self.keep_ray_logs()
        shutil.rmtree(f"{self.hosts.workdir}/ray", ignore_errors=True)  # the old session's folders
        self.hosts.start_head(num_cpus=CPUS_PER_HOST)
        self.hosts.join(self.hosts[1], num_cpus=CPUS_PER_HOST)

    def keep_ray_logs(self) -> None:
        """The Ray session's logs of both hosts (jobs' drivers, the dashboard, the GCS), into the run's folder
        before a new head or ``down()`` removes them: what Ray did with a stop is told only there."""
        for logs in Path(self.hosts.workdir).glob("ray*/session_2*/logs"):
            dest = self.out / "ray-logs" / logs.parent.parent.name / logs.parent.name  # ray (host 1), ray-1
            try:
                shutil.copytree(logs, dest, dirs_exist_ok=True, ignore_dangling_symlinks=True)
            except (OSError, shutil.Error) as err:
                print(f"[chaos] Ray's logs at {logs} not kept: {err}", flush=True)

    def s3_down(self) -> None:
        """S3 refuses connections and the open ones are cut; its buckets stay."""
        assert self.gate is not None
        self.gate.close()

    def s3_up(self) -> None:
        assert self.gate is not None
        self.gate.open()

    def restart(self, component: str) -> None:
        """An Airflow component stopped as a deployment restarts it (SIGTERM, SIGKILL after 30 s), started again."""
        assert self.stack is not None
        self.stack.restart(component)

    def kill_and_start(self, component: str) -> None:
        """An Airflow component killed outright (its whole process group), started again."""
        assert self.stack is not None
        process = self.stack.processes.pop(component)
        with contextlib.suppress(ProcessLookupError):  # it exited on its own first: it is started all the same
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)
        self.stack.launch(component)

    # --- processes ---------------------------------------------------------------------------------

    def host_pids(self, index: int) -> list[int]:
        return self.hosts.pids(self.hosts[index])

    def train_worker_pids(self) -> list[tuple[int, int]]:
        """(host index, pid) of every Ray Train worker process on the hosts, in a stable order."""
        found = []
        for index in range(2):
            for pid in self.host_pids(index):
                if cmdline(pid).startswith("ray::RayTrainWorker"):
                    found.append((index, pid))
        return sorted(found)


class Gate:
    """A TCP gate in front of a server: while open it passes connections to ``target``; ``close()``
    refuses new ones (nothing listens) and cuts those open, as a server that went away. ``delay_s``
    holds back what it passes, each way, as a slow network does."""

    def __init__(self, listen: tuple[str, int], target: tuple[str, int]) -> None:
        self.listen, self.target = listen, target
        self.delay_s = 0.0
        self._server: socket.socket | None = None
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()

    @property
    def is_open(self) -> bool:
        return self._server is not None

    def open(self) -> None:
        server = socket.socket()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(self.listen)
        server.listen(128)
        self._server = server
        threading.Thread(target=self._accept, args=(server,), daemon=True).start()

    def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            with contextlib.suppress(OSError):
                server.shutdown(socket.SHUT_RDWR)
            server.close()
        with self._lock:
            cut, self._open = self._open, set()
        for sock in cut:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _accept(self, server: socket.socket) -> None:
        while True:
            try:
                client, _ = server.accept()
            except OSError:
                return  # closed
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                if self._server is not server:
                    client.close()
                    upstream.close()
                    return
                self._open |= {client, upstream}
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                if self.delay_s:
                    time.sleep(self.delay_s)
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):  # the other direction's pump wakes up and ends too
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
            with self._lock:
                self._open -= {source, sink}
            source.close()


def task_process(ti_id: str) -> int | None:
    """The pid of the Airflow task process of a task instance (its title: ``airflow worker -- <id>``)."""
    title = f"airflow worker -- {ti_id}"
    return next((pid for pid in pids() if cmdline(pid) == title), None)
