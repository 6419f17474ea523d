"""The spread deployment of `make chaos` (``CHAOS_DEPLOYMENT=spread``): Airflow as production runs it,
over machines, here six network namespaces on one bridge (``harness/hosts.py``):

- host 1 the Ray head, host 2 a Ray worker node (as in the single deployment);
- host 3 Airflow's scheduler, api-server and dag-processor;
- hosts 4 and 5 a Celery worker each (``CeleryExecutor``);
- host 6 the triggerer;
- in the root namespace, on the bridge's address: PostgreSQL (behind a gate: it listens on 127.0.0.1
  only), Redis from Debian's package as the Celery broker, and S3 (moto) behind its gate, with a switch
  that makes it answer writes ``503 SlowDown``.

The faults it adds (chaos/faults.py does them at their second): a link cut both ways, a lossy host,
PostgreSQL and the broker restarted, S3 refusing writes. The Airflow processes share this machine's
disk (their logs), as deployments share a log volume or remote logging; the DAGs' storage is S3.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from pathlib import Path

from chaos import network, schedule
from chaos.deployment import Deployment, Gate
from harness import hosts as hostlib
from harness.ports import free_port
from harness.postgres import USER, Postgres
from harness.stack import Stack, airflow_bin

SUBNET = "10.81.0"  # apart from the single deployment's 10.80.0
# Host names, in the hosts' order (host i is 10.81.0.i).
NAMES = ("ray-head", "ray-node", "airflow-control", "airflow-worker1", "airflow-worker2", "airflow-triggerer")
RAY_HEAD, RAY_NODE, CONTROL, WORKER1, WORKER2, TRIGGERER = range(6)
WORKERS = (WORKER1, WORKER2)
# Where each of Airflow's components runs.
PLACEMENT = {
    "api-server": CONTROL,
    "scheduler": CONTROL,
    "dag-processor": CONTROL,
    "celery-worker1": WORKER1,
    "celery-worker2": WORKER2,
    "triggerer": TRIGGERER,
}
# Task processes per Celery worker: together the deployment's parallelism, so a queued task waits for
# nothing but a worker to take it.
WORKER_CONCURRENCY = 6
# Airflow's own recovery of a task left queued (a message the broker lost): re-queued after this long.
TASK_QUEUED_TIMEOUT_S = 300
# The elastic trainings' own pool (chaos/dags/chaos_dags.py reads its name from CHAOS_ELASTIC_POOL).
ELASTIC_POOL = "chaos_elastic"
# The service manager's look at Airflow's components, and its wait before starting an ended one again
# (systemd's RestartSec; Airflow's scheduler, triggerer and dag-processor exit when PostgreSQL goes away).
SUPERVISE_S, RESTART_AFTER_S = 2.0, 5.0


class SpreadStack(Stack):
    """Airflow's components each on its host: the api-server on the control host's address, the Celery
    workers on theirs, the triggerer on its own."""

    def __init__(self, hosts: hostlib.Hosts, home: Path, dags: Path, database_url: str, env: dict) -> None:
        port = free_port()
        super().__init__(home, dags, port, database_url, env)
        self.hosts = hosts
        self.url = f"http://{hosts[CONTROL].address}:{port}"
        self.env.update(
            {
                "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
                "AIRFLOW__API__BASE_URL": self.url,
                "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.url}/execution/",
            }
        )

    def start(self, timeout: float = 180, migrated: bool = False) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(exist_ok=True)
        if not migrated:
            self.migrate()
        for name in PLACEMENT:
            self.launch(name)
        self.wait_until_served(timeout)

    def launch(self, name: str) -> None:
        if name.startswith("celery-worker"):
            args = [airflow_bin(), "celery", "worker", "--concurrency", str(WORKER_CONCURRENCY)]
        else:
            args = [airflow_bin(), name] + (["--port", str(self.port)] if name == "api-server" else [])
        log = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115 - the process holds it
        self.processes[name] = subprocess.Popen(
            self.hosts.command(self.hosts[PLACEMENT[name]], args),
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


class Redis:
    """Debian's ``redis-server`` on one address, its data (an append-only file, as a broker that must
    not lose queued tasks over a restart keeps) in ``folder``."""

    def __init__(self, folder: Path, address: str) -> None:
        self.folder, self.address = folder, address
        self.port = free_port(address)
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://{self.address}:{self.port}/0"

    def start(self) -> Redis:
        server = shutil.which("redis-server")
        if server is None:
            raise RuntimeError("no redis-server: scripts/setup_debian_packages.sh installs Debian's package")
        self.folder.mkdir(parents=True, exist_ok=True)
        args = [server, "--bind", self.address, "--port", str(self.port), "--dir", str(self.folder)]
        args += ["--appendonly", "yes", "--save", "", "--protected-mode", "no", "--daemonize", "no"]
        self.process = subprocess.Popen(
            args, stdout=open(self.folder / "redis.log", "ab"), stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.monotonic() + 30
        while not self.answers():
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise RuntimeError(f"redis-server did not start: {(self.folder / 'redis.log').read_text()[-1000:]}")
            time.sleep(0.2)
        return self

    def answers(self) -> bool:
        import socket

        try:
            with socket.create_connection((self.address, self.port), timeout=2) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        """As a service manager stops it: SIGTERM (Redis writes its file and exits), SIGKILL after 10 s."""
        process, self.process = self.process, None
        if process is None:
            return
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


class SlowDown:
    """A WSGI middleware in front of moto: while ``refusing``, every write (PUT, POST, DELETE) is answered
    ``503 SlowDown`` as S3 answers a client it throttles; reads pass. ``delay_s`` holds back every answer."""

    BODY = (
        b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
        b"<Message>Please reduce your request rate.</Message></Error>"
    )

    def __init__(self, app) -> None:
        self.app = app
        self.refusing = False
        self.refused = 0
        self.delay_s = 0.0

    def __call__(self, environ, start_response):
        if self.delay_s:
            time.sleep(self.delay_s)
        if self.refusing and environ.get("REQUEST_METHOD") in ("PUT", "POST", "DELETE"):
            self.refused += 1
            start_response(
                "503 Slow Down", [("Content-Type", "application/xml"), ("Content-Length", str(len(self.BODY)))]
            )
            return [self.BODY]
        return self.app(environ, start_response)


class SpreadDeployment(Deployment):
    name = "spread"
    executor = "CeleryExecutor"

    def __init__(self, out: Path) -> None:
        super().__init__(out)
        self.hosts = hostlib.Hosts(len(NAMES), etc_hosts=hostlib.DEBIAN, subnet=SUBNET, names=NAMES)
        self.postgres: Postgres | None = None
        self.postgres_gate: Gate | None = None
        self.redis: Redis | None = None
        self.slow_down: SlowDown | None = None
        self.rules: dict[str, list[list[str]]] = {}  # netns -> the fault rules in it now
        self._rules_lock = threading.Lock()
        self._supervising = threading.Event()
        self._supervisor = threading.Thread(target=self._supervise, name="chaos-service-manager", daemon=True)

    def host_roles(self) -> dict[str, str]:
        roles = {NAMES[RAY_HEAD]: "Ray head", NAMES[RAY_NODE]: "Ray worker node"}
        roles[NAMES[CONTROL]] = "Airflow scheduler, api-server, dag-processor"
        roles.update({NAMES[i]: "Airflow Celery worker" for i in WORKERS})
        roles[NAMES[TRIGGERER]] = "Airflow triggerer"
        roles["root namespace"] = "PostgreSQL, Redis (Celery broker), S3 (moto)"
        return roles

    # --- up and down -----------------------------------------------------------------------------

    def up(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        self.start_s3_and_ray()
        # moto's in-process server is werkzeug's, which reads its app at each request.
        assert self.s3 is not None and self.s3._server is not None
        wsgi = self.s3._server._server
        self.slow_down = SlowDown(wsgi.app)
        wsgi.app = self.slow_down
        self.postgres = Postgres(self.out / "postgres").start()
        self.postgres.create_database("airflow")
        self.postgres_gate = Gate(
            (self.hosts.root_address, free_port(self.hosts.root_address)), ("127.0.0.1", self.postgres.port)
        )
        self.postgres_gate.open()
        self.redis = Redis(self.out / "redis", self.hosts.root_address).start()
        database = f"postgresql+psycopg2://{USER}@{self.hosts.root_address}:{self.postgres_port}/airflow"
        self.stack = SpreadStack(self.hosts, self.out / "airflow", self.dags, database, self.airflow_env())
        self.airflow.callback(self.stack.stop)
        self.airflow.callback(self._supervising.clear)  # runs first: nothing is started again while stopping
        self.stack.start()
        self.create_pool()
        self._supervising.set()
        self._supervisor.start()

    def _supervise(self) -> None:
        """As systemd's ``Restart=always`` (Airflow's own unit files): a component that exited is started
        again after ``RESTART_AFTER_S``. The injector's restarts take the process out of the table first,
        so they are not seen here."""
        started = time.monotonic()
        ended_since: dict[str, float] = {}
        while self._supervising.wait(SUPERVISE_S) and self._supervising.is_set():
            stack = self.stack
            assert stack is not None
            for name, process in list(stack.processes.items()):
                if process.poll() is None:
                    ended_since.pop(name, None)
                    continue
                since = ended_since.setdefault(name, time.monotonic())
                if time.monotonic() - since >= RESTART_AFTER_S and stack.processes.get(name) is process:
                    stack.launch(name)
                    ended_since.pop(name, None)
                    at_s = round(time.monotonic() - started, 1)
                    self.restarted.append({"component": name, "exit_code": process.returncode, "at_s": at_s})

    @property
    def postgres_port(self) -> int:
        assert self.postgres_gate is not None
        return self.postgres_gate.listen[1]

    def down(self) -> None:
        for step in (
            self.airflow.close,
            lambda: self.redis and self.redis.stop(),
            lambda: self.postgres and self.postgres.remove(),
            lambda: self.postgres_gate and self.postgres_gate.close(),
        ):
            try:
                step()
            except Exception as err:  # noqa: BLE001 - the next part must still go
                print(f"[chaos] cleaning up: {type(err).__name__}: {err}", flush=True)
        super().down()

    def pools(self) -> dict[str, int]:
        # An elastic training takes 2 slots: in the shared pool the 1-slot tasks always took the slot
        # that freed first, and every elastic run of the first spread soak starved.
        return {**super().pools(), ELASTIC_POOL: 2}

    def airflow_env(self) -> dict[str, str]:
        assert self.redis is not None
        return {
            **super().airflow_env(),
            "CHAOS_ELASTIC_POOL": ELASTIC_POOL,
            "AIRFLOW__CELERY__BROKER_URL": self.redis.url,
            "AIRFLOW__CELERY__WORKER_CONCURRENCY": str(WORKER_CONCURRENCY),
            "AIRFLOW__CORE__PARALLELISM": str(WORKER_CONCURRENCY * len(WORKERS)),
            "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT": str(TASK_QUEUED_TIMEOUT_S),
        }

    def recovery_s(self) -> dict[str, float]:
        return {**super().recovery_s(), "queued": float(TASK_QUEUED_TIMEOUT_S)}

    # --- the links a partition cuts ---------------------------------------------------------------

    def link_rules(self, link: str, side: float) -> tuple[str, str, list[list[str]]]:
        """(namespace, what is cut, rules) of one of ``schedule.LINKS``; ``side`` picks the worker."""
        worker = self.hosts[WORKERS[min(int(side * len(WORKERS)), len(WORKERS) - 1)]]
        head = self.hosts[RAY_HEAD]
        if link == "worker-ray_head":
            return worker.netns, f"{worker.name} <-> {head.name}", network.drop_peer(head.address)
        if link == "triggerer-ray_head":
            triggerer = self.hosts[TRIGGERER]
            return triggerer.netns, f"{triggerer.name} <-> {head.name}", network.drop_peer(head.address)
        if link == "ray_host-ray_host":
            node = self.hosts[RAY_NODE]
            return node.netns, f"{node.name} <-> {head.name}", network.drop_peer(head.address)
        if link == "worker-postgres":
            rules = network.drop_peer(self.hosts.root_address, self.postgres_port)
            return worker.netns, f"{worker.name} <-> PostgreSQL", rules
        raise ValueError(f"link {link!r}: one of {schedule.LINKS}")

    def lossy_host(self, pick: float) -> hostlib.Host:
        return schedule.pick(list(self.hosts.hosts), pick)

    def add_rules(self, netns: str, rules: list[list[str]]) -> None:
        with self._rules_lock:
            network.apply(netns, rules)
            self.rules.setdefault(netns, []).extend(rules)

    def remove_rules(self, netns: str, rules: list[list[str]]) -> None:
        with self._rules_lock:
            network.remove(netns, rules)
            left = self.rules.get(netns, [])
            for rule in rules:
                if rule in left:
                    left.remove(rule)

    # --- the other faults ---------------------------------------------------------------------------

    def postgres_down(self) -> None:
        assert self.postgres is not None
        self.postgres.stop()

    def postgres_up(self) -> None:
        assert self.postgres is not None
        self.postgres.start()

    def broker_down(self) -> None:
        assert self.redis is not None
        self.redis.stop()

    def broker_up(self) -> None:
        assert self.redis is not None
        self.redis.start()

    def refuse_writes(self, refusing: bool) -> None:
        assert self.slow_down is not None
        self.slow_down.refusing = refusing

    def slow_link(self, link: str, delay_s: float) -> str:
        """Every exchange on ``link`` (one of ``schedule.SLOW_LINKS``) held back ``delay_s`` (0: as it was);
        what is slowed, in words."""
        if link == "postgres":
            assert self.postgres_gate is not None
            self.postgres_gate.delay_s = delay_s
            return "PostgreSQL's link (every host's)"
        assert self.slow_down is not None
        self.slow_down.delay_s = delay_s
        return "S3's answers"

    def ray_node_back(self, timeout: float = 60) -> bool:
        """Host 2's Ray node alive again after its link to the head came back; started again (as its
        service manager would) when the head had declared it dead meanwhile. True if it was restarted."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if len(self.hosts.alive_nodes()) == 2:
                return False
            time.sleep(2)
        with self.topology:
            self.bring_back_host_fresh()
        return True

    def bring_back_host_fresh(self) -> None:
        self.hosts.stop_ray(self.hosts[RAY_NODE])
        self.bring_back_host()

    def mend_extras(self) -> list[str]:
        """After the last fault: every fault rule gone, PostgreSQL, the broker and S3's writes back."""
        mended = []
        with self._rules_lock:
            for netns, rules in self.rules.items():
                if rules:
                    mended.append(f"{len(rules)} iptables rule(s) left in {netns}")
                network.flush(netns)
            self.rules.clear()
        if self.postgres is not None and not (self.postgres.data / "postmaster.pid").exists():
            self.postgres.start()
            mended.append("PostgreSQL started")
        if self.redis is not None and self.redis.process is None:
            self.redis.start()
            mended.append("Redis started")
        if self.slow_down is not None and self.slow_down.refusing:
            self.slow_down.refusing = False
            mended.append("S3 takes writes again")
        return mended
