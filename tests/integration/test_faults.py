"""Faults around a running job, against the real local cluster: a triggerer restart, a user's kill
while the task is deferred, and a Ray dashboard that goes away at submit time and while waiting."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import shlex
import socket
import threading
import time
import uuid

import pytest

from airflow_provider_horovod.contract import JOB_STOP_WAIT_S, XCOM_LOG_CURSOR
from airflow_provider_horovod.exceptions import RayClusterUnreachableError, TaskKilledError
from airflow_provider_horovod.failures import stopped_by_request
from airflow_provider_horovod.hooks import ray_transport
from airflow_provider_horovod.operators.ray import RayTaskOperator
from airflow_provider_horovod.triggers.ray import RayJobTrigger
from harness.tasks import (
    HUNG_S,
    FakeTI,
    assert_stopped,
    jobs_of,
    retry_waits,
    run_deferred,
    run_in_thread,
    running_after,
    wait_for_status,
    wait_until,
)

from .test_operator import long_quick_job, make_operator

pytestmark = pytest.mark.integration


def counting_job(hook, ticks: int, every_s: float, repeats: int = 0) -> str:
    """A plain Ray job printing a numbered line each tick, each followed by ``repeats`` identical
    lines (a training log repeats itself), for watching what a trigger streams."""
    code = (
        f"import time\nfor i in range({ticks}):\n    print(f'line-{{i:03d}}', flush=True)\n"
        f"    for _ in range({repeats}):\n        print('epoch 3 loss 0.5', flush=True)\n    time.sleep({every_s})"
    )
    sid = f"ahp-count-{uuid.uuid4().hex[:8]}"
    return hook.submit_job(entrypoint=f"python -c {shlex.quote(code)}", submission_id=sid)


class XComStore:
    """The task's XComs as the triggerer's Airflow API would keep them (there is no API server here)."""

    def __init__(self):
        self.values = {}

    async def aset(self, *, key, value, dag_id, task_id, run_id, map_index=-1, **_):
        self.values[(dag_id, task_id, run_id, map_index, key)] = value

    async def aget_one(self, *, key, dag_id, task_id, run_id, map_index=None, **_):
        return self.values.get((dag_id, task_id, run_id, map_index, key))


class Streamed:
    """The job's log lines that triggers wrote to the task log (Airflow's logging prints them)."""

    def __init__(self, capsys, caplog):
        self.capsys, self.caplog = capsys, caplog
        self.text = ""

    def lines(self) -> list[str]:
        """Every job line streamed so far (Airflow's structlog prints them, padded, before the logger's name)."""
        self.text += self.capsys.readouterr().out
        logged = [r.getMessage()[len("[ray] ") :] for r in self.caplog.records if r.getMessage().startswith("[ray] ")]
        printed = re.findall(r"\[ray\] (.*?)\s+\[airflow_provider_horovod\.", self.text)
        return logged or printed


def test_a_restarted_trigger_repeats_no_line_and_yields_one_event(ray_cluster, ray_hook, monkeypatch, capsys, caplog):
    from airflow.sdk.execution_time.xcom import XCom

    store = XComStore()
    monkeypatch.setattr(XCom, "aset", store.aset)
    monkeypatch.setattr(XCom, "aget_one", store.aget_one)
    caplog.set_level(logging.INFO)
    streamed = Streamed(capsys, caplog)
    jobs_before = len(ray_hook.list_jobs())
    # 40 identical lines after each numbered one: runs longer than the cursor's digests, and a log
    # far longer than one window of its end.
    sid = counting_job(ray_hook, ticks=30, every_s=0.3, repeats=40)
    # What the operator serialised at defer time; a restarted triggerer gets exactly this again.
    classpath, kwargs = RayJobTrigger(submission_id=sid, policy={"poll_interval_s": 0.5}).serialize()
    ti = FakeTI(f"restart-{uuid.uuid4().hex[:6]}")

    async def scenario():
        first = RayJobTrigger(**kwargs)
        first.task_instance = ti
        events = []

        async def consume(trigger):
            async for event in trigger.run():
                events.append(event)

        task = asyncio.create_task(consume(first))
        deadline = time.monotonic() + HUNG_S
        while len([line for line in streamed.lines() if line.startswith("line-")]) < 8:
            assert time.monotonic() < deadline, f"the trigger streamed {streamed.lines()}"
            assert not task.done(), f"the trigger streamed {streamed.lines()}"
            await asyncio.sleep(0.1)
        task.cancel()  # the triggerer goes down: no user action, so no on_kill
        with pytest.raises(asyncio.CancelledError):
            await task
        second = RayJobTrigger(**kwargs)
        second.task_instance = ti
        await asyncio.wait_for(consume(second), timeout=HUNG_S)
        return events

    events = asyncio.run(scenario())
    assert len(events) == 1, events
    assert events[0].payload["outcome"] == "success", events
    lines = streamed.lines()
    assert len(lines) > 1200
    assert lines == ray_hook.get_job_logs(sid).splitlines()  # each line once, in order
    saved = store.values[(ti.dag_id, ti.task_id, ti.run_id, -1, XCOM_LOG_CURSOR)]
    assert (saved["submission_id"], saved["lines"]) == (sid, len(ray_hook.get_job_logs(sid).splitlines()))
    assert len(ray_hook.list_jobs()) == jobs_before + 1  # the trigger never submits


@pytest.mark.oldest_airflow
def test_a_kill_while_deferred_stops_the_job(ray_cluster, ray_hook, tmp_path, quick_jobs, monkeypatch):
    from airflow.providers.common.compat.sdk import TaskDeferred

    from airflow_provider_horovod import airflow_compat as compat

    ti = FakeTI(f"dkill-{uuid.uuid4().hex[:6]}")
    op = make_operator(tmp_path, deferrable=True, train_loop_config=long_quick_job())
    op.sync_wait_before_defer_s = 0  # defer at once: the kill is what the test is about
    begun = time.monotonic()
    with pytest.raises(TaskDeferred) as deferred:
        op.execute({"ti": ti})
    trigger = deferred.value.trigger
    sid = trigger.submission_id
    assert sid == ti.task_run.submission_id(1)
    trigger.task_instance = ti
    if not compat.trigger_on_kill_supported():
        # Before Airflow 3.3 the triggerer only cancels the trigger; the trigger asks Airflow for the
        # task's state (here what the API answers once the user marked the task failed).
        from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

        monkeypatch.setattr(
            RuntimeTaskInstance, "get_task_states", staticmethod(lambda **kw: {ti.run_id: {ti.task_id: "failed"}})
        )

    async def scenario():
        task = asyncio.create_task(anext(trigger.run(), None))
        start_s = await asyncio.to_thread(running_after, ray_hook, sid, begun)
        # What the triggerer does when the user marks the task failed: cancel, then on_kill.
        asked = time.monotonic()
        task.cancel("Task cancelled by user action")
        with pytest.raises(asyncio.CancelledError):
            await task
        if compat.trigger_on_kill_supported():
            await trigger.on_kill()
        return asked, start_s

    assert_stopped(ray_hook, sid, *asyncio.run(scenario()))


class Outage:
    """A TCP proxy in front of the Ray dashboard that can be taken down (every new connection closed
    unanswered, open ones cut) and brought back, as when the head restarts or the network drops. It
    counts the connections it refused, so a test knows the outage was really met."""

    def __init__(self, target_port: int):
        self.target = ("127.0.0.1", target_port)
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        self.open: list[socket.socket] = []
        self.refused = 0
        self.refused_at: list[float] = []  # time.monotonic() of each refusal
        self.serving = True
        self.changed = threading.Condition()
        threading.Thread(target=self._accept, daemon=True).start()

    def up(self):
        with self.changed:
            self.serving = True

    def down(self):
        with self.changed:
            self.serving = False
            for s in self.open:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()
            self.open.clear()

    def wait_refused(self, count: int, timeout: float = HUNG_S) -> None:
        """Until ``count`` more connections came and were refused: the client met the outage."""
        with self.changed:
            wanted = self.refused + count
            assert self.changed.wait_for(lambda: self.refused >= wanted, timeout), (
                f"nothing tried the dashboard during the outage ({self.refused} refused)"
            )

    def close(self):
        self.down()
        self.listener.close()

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # closed
            with self.changed:
                if not self.serving:
                    # Counted before the close that the client sees: a test reading the count once its
                    # request failed must find it there, however late this thread runs again.
                    self.refused += 1
                    self.refused_at.append(time.monotonic())
                    client.close()
                    self.changed.notify_all()
                    continue
            self._connect(client)

    def _connect(self, client):
        try:
            server = socket.create_connection(self.target)
        except OSError:
            client.close()
            return
        with self.changed:
            self.open += [client, server]
        for a, b in ((client, server), (server, client)):
            threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src, dst):
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


@pytest.fixture
def outage(ray_cluster, monkeypatch):
    """Connection ``ray_flaky``: the local cluster, reached through the proxy."""
    port = int(ray_cluster.dashboard_url.rsplit(":", 1)[1])
    proxy = Outage(port)
    monkeypatch.setenv(
        "AIRFLOW_CONN_RAY_FLAKY",
        json.dumps(
            {
                "conn_type": "ray",
                "host": "127.0.0.1",
                "port": proxy.port,
                "password": ray_cluster.token,
                "extra": {"shared_storage": True},
            }
        ),
    )
    yield proxy
    proxy.close()


@pytest.mark.parametrize("deferrable", [False, True], ids=["sync", "deferred"])
def test_a_dashboard_that_comes_back_within_the_retries_costs_nothing(
    outage, ray_hook, tmp_path, deferrable, quick_jobs
):
    run_id = f"flaky-{uuid.uuid4().hex[:6]}"
    op = make_operator(
        tmp_path,
        train_loop_config={"quick_lines": 12, "quick_line_s": 1, "run": run_id},
        ray_conn_id="ray_flaky",
        deferrable=deferrable,
    )
    ti = FakeTI(run_id)
    sid = ti.task_run.submission_id(1)
    outage.down()  # down when the task starts
    thread, outcome = run_in_thread(op, {"ti": ti}, run=run_deferred if deferrable else None)
    outage.wait_refused(1)
    outage.up()
    wait_for_status(ray_hook, sid, {"RUNNING"})
    outage.down()  # and again while the task waits
    outage.wait_refused(2)  # the wait's polls met it, and were retried
    outage.up()
    thread.join(HUNG_S)
    assert not thread.is_alive()
    assert "error" not in outcome, outcome
    assert "result" in outcome, outcome
    assert outcome["result"]["metrics"]["run"] == run_id
    assert ti.xcoms["checkpoint_uri"] == outcome["result"]["checkpoint_uri"]
    assert [j["submission_id"] for j in jobs_of(ray_hook, run_id)] == [sid]  # one job, submitted once


def test_a_dashboard_that_stays_away_fails_the_task_clearly(outage, ray_hook, tmp_path):
    run_id = f"gone-{uuid.uuid4().hex[:6]}"
    op = make_operator(tmp_path, ray_conn_id="ray_flaky")
    outage.down()
    started = time.monotonic()
    with pytest.raises(RayClusterUnreachableError) as err:
        op.execute({"ti": FakeTI(run_id)})
    took = time.monotonic() - started
    message = str(err.value)
    assert f"http://127.0.0.1:{outage.port}" in message
    assert "'ray_flaky'" in message
    assert f"after {ray_transport.RETRIES} tries" in message
    assert outage.refused == ray_transport.RETRIES, outage.refused_at  # every try met the outage, and no more
    # The retry policy's waits between the tries (a refusal is noted before its try sees it, the next try comes
    # after the wait), and given up at the last try: sooner after it than a further try would have come.
    waits = retry_waits()
    gaps = [later - earlier for earlier, later in zip(outage.refused_at, outage.refused_at[1:])]
    assert all(gap >= wait for gap, wait in zip(gaps, waits)), (gaps, waits)
    assert took - (outage.refused_at[-1] - started) < waits[-1], (took, outage.refused_at)
    assert jobs_of(ray_hook, run_id) == []  # nothing reached the cluster


def test_a_task_killed_while_its_job_is_pending_keeps_the_attempts_record(ray_hook, tmp_path):
    """Ray stops a PENDING job by starting its driver and sending it SIGTERM at once, before the entrypoint
    can handle it (the spread chaos run's sweep training, marked failed while its job waited for its
    supervisor): the record comes from the side that stopped it."""
    # Every CPU of the cluster held by a job: the task's job, which asks for one, stays PENDING.
    cpus = ray_hook.get_cluster_resources()["CPU"]
    submitted = time.monotonic()
    blocker = ray_hook.submit_job(
        entrypoint="python -c 'import time; time.sleep(600)'",
        submission_id=f"ahp-blocker-{uuid.uuid4().hex[:8]}",
        entrypoint_num_cpus=cpus,
    )
    try:
        wait_for_status(ray_hook, blocker, {"RUNNING"})
        supervisor_start_s = time.monotonic() - submitted  # a job's start on this machine, in this run
        ti = FakeTI(f"pkill-{uuid.uuid4().hex[:6]}")
        op = RayTaskOperator(
            task_id="train", python_callable="time:sleep", op_args=[1], storage_path=str(tmp_path), deferrable=False
        )
        thread, outcome = run_in_thread(op, {"ti": ti})
        wait_until(lambda: op.submission_id, HUNG_S, "the submission", outcome)
        sid = op.submission_id
        assert ray_hook.get_job_info(sid)["status"] == "PENDING"
        op.on_kill()
    finally:
        ray_hook.stop_job(blocker)
    # The blocker's driver ends within Ray's stop wait, freeing its CPUs; the task's supervisor then starts (as
    # long as the blocker's took, stretched by load at most twice) and stops its driver within that wait again.
    ended_within_s = 2 * supervisor_start_s + 2 * JOB_STOP_WAIT_S
    assert wait_for_status(ray_hook, sid, {"STOPPED"}, timeout=ended_within_s) == "STOPPED"
    thread.join(HUNG_S)
    assert isinstance(outcome.get("error"), TaskKilledError), outcome
    info = ray_hook.get_job_info(sid)
    # Ray's line that it runs the entrypoint is the log's last: the driver printed nothing, not even an error.
    assert ray_hook.get_job_logs(sid).rstrip().endswith(info["entrypoint"])
    with open(info["metadata"]["ahp_result_uri"]) as f:
        record = json.load(f)
    assert record["submission_id"] == sid, record
    assert record["attempt"] == 1, record
    assert record["failure"]["failure_class"] == "infrastructure", record
    assert stopped_by_request(record["failure"]), record
    assert "PENDING" in record["failure"]["summary"], record
