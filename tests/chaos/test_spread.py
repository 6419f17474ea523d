"""The spread deployment's own parts that need no deployment: its faults' schedule, the links a partition
cuts, the proxies that make a link slow, S3 refusing writes, the broker over a restart (chaos/spread.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from chaos import schedule

REPO = Path(__file__).resolve().parents[2]


def test_the_spread_schedule_holds_its_own_faults_and_the_single_one_is_as_it_was():
    spread = schedule.fault_schedule(5, 20, kinds=schedule.SPREAD_FAULT_KINDS)
    assert {f.kind for f in spread} == set(schedule.SPREAD_FAULT_KINDS)
    assert spread == schedule.fault_schedule(5, 20, kinds=schedule.DEPLOYMENTS["spread"])
    for fault in spread:
        low, high = schedule.DURATIONS_S.get(fault.kind, (0.0, 0.0))
        assert low <= fault.duration_s <= high
        if fault.kind in schedule.AMOUNTS:
            low, high = schedule.AMOUNTS[fault.kind]
            assert low <= fault.amount <= high
        else:
            assert fault.amount == 0.0
    # The single deployment's schedule draws no new kind and no new number: a seed repeats an older run.
    single = schedule.fault_schedule(5, 20)
    assert single == schedule.fault_schedule(5, 20, kinds=schedule.DEPLOYMENTS["single"])
    assert {f.kind for f in single} == set(schedule.FAULT_KINDS)
    assert all(f.amount == 0.0 for f in single)


def test_the_spread_schedule_is_the_same_in_another_interpreter():
    code = (
        "import json; from chaos import schedule as s; "
        "print(json.dumps([f.to_dict() for f in s.fault_schedule(31, 20, kinds=s.SPREAD_FAULT_KINDS)]))"
    )
    import json

    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True, env={"PATH": ""}
    ).stdout
    assert json.loads(out) == [f.to_dict() for f in schedule.fault_schedule(31, 20, kinds=schedule.SPREAD_FAULT_KINDS)]


def test_a_partition_drops_both_ways_and_a_lossy_link_a_share_of_each_way():
    from chaos import network

    assert network.drop_peer("10.81.0.1") == [
        ["OUTPUT", "-d", "10.81.0.1", "-j", "DROP"],
        ["INPUT", "-s", "10.81.0.1", "-j", "DROP"],
    ]
    assert network.drop_peer("10.81.0.254", 5432) == [
        ["OUTPUT", "-d", "10.81.0.254", "-p", "tcp", "--dport", "5432", "-j", "DROP"],
        ["INPUT", "-s", "10.81.0.254", "-p", "tcp", "--sport", "5432", "-j", "DROP"],
    ]
    rules = network.drop_share("eth0", 0.125)
    assert [r[:3] for r in rules] == [["INPUT", "-i", "eth0"], ["OUTPUT", "-o", "eth0"]]
    assert all(["--probability", "0.125"] == r[r.index("--probability") :][:2] for r in rules)
    # Inside the host's namespace only: the root namespace's tables are never touched.
    assert network.command("ns1", "-A", rules[0])[:5] == ["ip", "netns", "exec", "ns1", "iptables"]
    import pytest

    with pytest.raises(ValueError):
        network.drop_share("eth0", 1.0)


def test_each_link_of_a_partition_is_cut_in_the_right_host(tmp_path):
    from chaos.deployment import Gate
    from chaos.spread import NAMES, SpreadDeployment

    spread = SpreadDeployment(tmp_path)  # nothing started: the hosts are only named
    spread.postgres_gate = Gate((spread.hosts.root_address, 6543), ("127.0.0.1", 5432))
    head = spread.hosts[0].address
    cut = {link: spread.link_rules(link, 0.0) for link in schedule.LINKS}
    assert cut["worker-ray_head"][1] == f"{NAMES[3]} <-> {NAMES[0]}"
    assert spread.link_rules("worker-ray_head", 0.9)[1] == f"{NAMES[4]} <-> {NAMES[0]}"
    assert cut["triggerer-ray_head"][0] == spread.hosts[5].netns
    assert cut["ray_host-ray_host"][0] == spread.hosts[1].netns
    assert all(rules[0][2] == head for link, (_, _, rules) in cut.items() if link != "worker-postgres")
    assert cut["worker-postgres"][2][0] == [
        "OUTPUT",
        "-d",
        spread.hosts.root_address,
        "-p",
        "tcp",
        "--dport",
        "6543",
        "-j",
        "DROP",
    ]
    assert set(spread.host_roles()) == {*NAMES, "root namespace"}


def test_a_slow_postgres_link_holds_back_each_exchange_and_is_as_it_was_after():
    import socket
    import threading
    import time

    from chaos.deployment import Gate
    from harness.ports import free_port

    echo = socket.create_server(("127.0.0.1", 0))

    def serve():
        conn, _ = echo.accept()
        while data := conn.recv(1024):
            conn.sendall(data)

    threading.Thread(target=serve, daemon=True).start()
    gate = Gate(("127.0.0.1", free_port("127.0.0.1")), echo.getsockname())
    gate.open()
    try:
        with socket.create_connection(gate.listen, timeout=10) as client:

            def round_trip() -> float:
                started = time.monotonic()
                client.sendall(b"ping")
                assert client.recv(1024) == b"ping"
                return time.monotonic() - started

            gate.delay_s = 0.3
            assert round_trip() >= 0.6  # held back each way
            gate.delay_s = 0.0
            assert round_trip() < 0.6  # the same connection, as it was
    finally:
        gate.close()
        echo.close()


def test_slow_s3_holds_back_every_answer_and_the_link_fault_picks_postgres_or_s3(tmp_path):
    import time

    from chaos.spread import SlowDown, SpreadDeployment

    def app(environ, start_response):
        start_response("200 OK", [])
        return [b"ok"]

    slow = SlowDown(app)
    slow.delay_s = 0.3
    started = time.monotonic()
    assert slow({"REQUEST_METHOD": "GET"}, lambda *a: None) == [b"ok"]
    assert time.monotonic() - started >= 0.3
    spread = SpreadDeployment(tmp_path)  # nothing started
    spread.slow_down = slow
    assert spread.slow_link("storage", 0.0) == "S3's answers"
    assert slow.delay_s == 0.0
    assert schedule.pick(list(schedule.SLOW_LINKS), 0.0) == "postgres"


def test_s3_refusing_writes_answers_slow_down_and_still_serves_reads():
    import boto3
    import pytest
    from botocore.config import Config
    from botocore.exceptions import ClientError

    from chaos.spread import SlowDown
    from harness.s3 import CREDENTIALS, MotoServer

    with MotoServer() as s3:
        wsgi = s3._server._server
        refusal = wsgi.app = SlowDown(wsgi.app)
        client = boto3.client(
            "s3",
            endpoint_url=s3.endpoint_url,
            region_name=CREDENTIALS["AWS_DEFAULT_REGION"],
            aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            config=Config(retries={"max_attempts": 1, "mode": "standard"}),
        )
        client.create_bucket(Bucket="refusals")
        client.put_object(Bucket="refusals", Key="k", Body=b"1")
        refusal.refusing = True
        with pytest.raises(ClientError) as err:
            client.put_object(Bucket="refusals", Key="k", Body=b"2")
        assert err.value.response["Error"]["Code"] == "SlowDown"
        assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503
        assert client.get_object(Bucket="refusals", Key="k")["Body"].read() == b"1"
        refusal.refusing = False
        client.put_object(Bucket="refusals", Key="k", Body=b"3")
        assert client.get_object(Bucket="refusals", Key="k")["Body"].read() == b"3"


def test_the_broker_keeps_what_it_held_over_a_restart(tmp_path):
    import shutil
    import socket

    import pytest

    if not shutil.which("redis-server"):
        pytest.skip("no redis-server: scripts/setup_debian_packages.sh installs it")
    from chaos.spread import Redis

    def ask(redis, *words):
        with socket.create_connection((redis.address, redis.port), timeout=5) as sock:
            sock.sendall(("*%d\r\n" % len(words) + "".join(f"${len(w)}\r\n{w}\r\n" for w in words)).encode())
            return sock.recv(100)

    redis = Redis(tmp_path / "redis", "127.0.0.1").start()
    try:
        assert ask(redis, "RPUSH", "queue", "task-1") == b":1\r\n"
        redis.stop()
        assert not redis.answers()
        redis.start()
        assert ask(redis, "LPOP", "queue") == b"$6\r\ntask-1\r\n"
    finally:
        redis.stop()


def test_each_ray_sessions_logs_are_kept_in_the_runs_folder(tmp_path):
    """A new head removes the old session's folders, and the end removes the hosts': what Ray did with a stop
    (the soak's job that ran on after its task was killed) is told only in those logs."""
    from chaos.spread import SpreadDeployment

    deployment = SpreadDeployment(tmp_path / "out")  # nothing started: the hosts are only named
    deployment.hosts.workdir = str(tmp_path / "hosts")
    for host, session in (("ray", "session_2026-11-30_18-00-00_1"), ("ray-1", "session_2026-11-30_18-00-01_2")):
        logs = tmp_path / "hosts" / host / session / "logs"
        logs.mkdir(parents=True)
        (logs / "dashboard.log").write_text(f"{host} stop_job\n")
    (tmp_path / "hosts" / "ray" / "session_latest").symlink_to(
        tmp_path / "hosts" / "ray" / "session_2026-11-30_18-00-00_1"
    )
    deployment.keep_ray_logs()
    kept = sorted(p.relative_to(tmp_path / "out" / "ray-logs").as_posix() for p in (tmp_path / "out").rglob("*.log"))
    assert kept == [
        "ray-1/session_2026-11-30_18-00-01_2/dashboard.log",
        "ray/session_2026-11-30_18-00-00_1/dashboard.log",
    ]


def test_a_component_that_exited_on_its_own_is_started_again_by_the_injectors_restart(tmp_path, monkeypatch):
    # The soak of Dec 1: the triggerer exited on its own (PostgreSQL away as it started) and the injector's
    # restart came before the service manager's; its SIGTERM found no process, and nothing started it again.
    from types import SimpleNamespace

    from chaos.deployment import Deployment
    from harness.stack import Stack

    stack = Stack(tmp_path, tmp_path, 0, "postgresql://unused")
    launched = []
    monkeypatch.setattr(stack, "launch", launched.append)
    deployment = SimpleNamespace(stack=stack)  # kill_and_start needs only the deployment's stack
    for restart in (stack.restart, lambda name: Deployment.kill_and_start(deployment, name)):
        exited = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
        exited.wait()
        stack.processes["triggerer"] = exited
        restart("triggerer")
    assert launched == ["triggerer", "triggerer"]
