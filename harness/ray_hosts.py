"""A Ray cluster on hosts made of network namespaces (``harness/hosts.py``), as a deployment's: a Ray
node on each host, S3 (moto) on the root namespace's address where every host reaches it, and the
Airflow connection to the head in this process's environment. Also: what an attempt on them left in
S3 (its worker groups, its checkpoints), and ``horovodrun`` across the hosts, as a team runs it.

    with RayHosts(Hosts(2, etc_hosts=DEBIAN), bucket="runs", conn_id="ray_hosts") as cluster:
        HorovodTrainOperator(..., ray_conn_id="ray_hosts", storage_path="s3://runs/x").execute(...)

Needs root (``hosts.unavailable_reason()`` says why not).
"""

from __future__ import annotations

import json
import os
import sys
import time

from harness.cluster import connection
from harness.hosts import Hosts, cluster_python
from harness.s3 import MotoServer

# A stand-in for ssh: horovodrun runs `ssh [options] <host> [options] <command>`; this runs the command
# in that host's namespace, under its name. Hosts by address, from AHP_SSH_HOSTS.
FAKE_SSH = f"""#!{sys.executable}
import json, os, sys
args = sys.argv[1:]
while args and args[0].startswith("-"):
    args = args[2:] if args[0] in ("-o", "-p", "-i") else args[1:]
host, rest = args[0], args[1:]
while rest and rest[0] in ("-o", "-p", "-i"):
    rest = rest[2:]
netns, name = json.loads(os.environ["AHP_SSH_HOSTS"])[host]
os.execvp("ip", ["ip", "netns", "exec", netns, "unshare", "--uts", "sh", "-c",
                 'hostname "$0" && exec sh -c "$1"', name, " ".join(rest)])
"""


class RayHosts:
    """``hosts`` made and a Ray node of ``num_cpus`` started on each, moto with ``bucket``, the connection
    ``conn_id`` set; all removed on leaving, and the environment as it was."""

    def __init__(self, hosts: Hosts, *, bucket: str, conn_id: str, num_cpus: int = 2) -> None:
        self.hosts, self.bucket, self.conn_id, self.num_cpus = hosts, bucket, conn_id, num_cpus
        self.moto: MotoServer | None = None
        self.saved: dict[str, str | None] = {}

    def __enter__(self) -> RayHosts:
        hosts = self.hosts
        try:
            hosts.up()
            self.moto = MotoServer(hosts.root_address).start()
            s3 = self.moto.env()
            hosts.extra_env.update(s3)  # the Ray nodes' own environment, as a cluster's instance role would give
            self.setenv(s3)
            self.moto.make_bucket(self.bucket)
            hosts.start_cluster(num_cpus=self.num_cpus)
            head = {"dashboard_url": hosts.dashboard_url, "token": hosts.token}
            self.setenv({f"AIRFLOW_CONN_{self.conn_id.upper()}": connection(head, shared_storage=False)})
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.hosts.down()
        if self.moto is not None:
            self.moto.stop()
        for key, value in self.saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value

    def setenv(self, values: dict[str, str]) -> None:
        for key, value in values.items():
            self.saved.setdefault(key, os.environ.get(key))
            os.environ[key] = value

    # -- what an attempt left in S3 ------------------------------------------------------------------

    def _key(self, ti, name: str, storage: str) -> str:
        from airflow_provider_horovod.contract import attempt_uri

        attempt = attempt_uri(ti.task_run.storage_uri(storage), 1)
        return f"{attempt}/{name}".split(f"s3://{self.bucket}/", 1)[1]

    def worker_groups(self, ti, storage: str) -> list[dict]:
        """Rank 0's notes of the worker groups of the task run's first attempt, as they are written."""
        import boto3

        from airflow_provider_horovod.contract import WORKER_GROUPS_FILE

        try:
            answer = boto3.client("s3").get_object(Bucket=self.bucket, Key=self._key(ti, WORKER_GROUPS_FILE, storage))
            return json.loads(answer["Body"].read())
        except Exception:  # noqa: BLE001 - not written yet
            return []

    def checkpoints(self, ti, storage: str) -> int:
        """How many checkpoint folders the first attempt has uploaded so far."""
        import boto3

        listed = boto3.client("s3").list_objects_v2(Bucket=self.bucket, Prefix=self._key(ti, "checkpoint_", storage))
        return len({i["Key"].split("/checkpoint_", 1)[1].split("/", 1)[0] for i in listed.get("Contents", [])})

    # -- horovodrun --------------------------------------------------------------------------------------

    def horovodrun(
        self, command: str, *, expect: str, cwd: str, env: dict | None = None, slots: int = 1
    ) -> tuple[str, float, float]:
        """``horovodrun -np N -H host1:SLOTS,...,hostN:SLOTS --gloo PYTHON COMMAND`` (N = SLOTS a host) run on
        host 1 from ``cwd``, its ssh to the other hosts the stand-in above; (its output and error, when it
        started, when it ended). Raises unless the output holds ``expect``."""
        hosts, python = self.hosts, cluster_python()
        bin_dir, ssh_dir = os.path.dirname(python), os.path.join(hosts.workdir, "bin")
        os.makedirs(ssh_dir, exist_ok=True)
        with open(os.path.join(ssh_dir, "ssh"), "w") as f:
            f.write(FAKE_SSH)
        os.chmod(os.path.join(ssh_dir, "ssh"), 0o755)
        ranks = ",".join(f"{h.address}:{slots}" for h in hosts.hosts)
        launch = f"{bin_dir}/horovodrun -np {slots * len(hosts.hosts)} -H {ranks} --gloo --start-timeout 60"
        line = f"cd {cwd} && {launch} {python} {command}"
        ssh_hosts = json.dumps({h.address: [h.netns, h.name] for h in hosts.hosts})
        path = f"{ssh_dir}:{bin_dir}:{os.environ.get('PATH', '')}"
        started = time.time()
        done = hosts.run(
            hosts[0], ["sh", "-c", line], env=hosts.env(PATH=path, AHP_SSH_HOSTS=ssh_hosts, **(env or {})), timeout=300
        )
        ended = time.time()
        if expect not in done.stdout:
            raise RuntimeError(f"horovodrun printed no {expect}:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
        return done.stdout + done.stderr, started, ended
