"""RayJobTrigger: serialisable arguments checked at construction (the wait policy travels whole), and
a run through the real RayHook against a stand-in for the Ray dashboard served over HTTP, which
streams each log line once and yields exactly one event (a JobEvent's dict)."""

import asyncio
import json
import re
import time

import pytest

from airflow_provider_horovod import airflow_compat as compat
from airflow_provider_horovod.contract import LOG_TAIL_LINES, META_RESOURCES, XCOM_LOG_CURSOR, JobStatus
from airflow_provider_horovod.exceptions import InvalidParameterError
from airflow_provider_horovod.jobs.events import JobEvent
from airflow_provider_horovod.jobs.logs import LogCursor
from airflow_provider_horovod.jobs.wait import WaitPolicy
from airflow_provider_horovod.triggers.ray import WRITE_SLICE_S, RayJobTrigger
from unit.fakes import FakeRay, FakeTI

SID = "ahp-dag-train-0123456789-a1"
FAST = WaitPolicy(poll_interval_s=0.001).to_dict()


CURSOR = LogCursor(SID).advanced([f"l{i}" for i in range(1, 8)])


def test_serialize_exact_and_rebuilt():
    policy = WaitPolicy(poll_interval_s=2.5, pending_timeout_s=60, stall_timeout_s=120)
    trigger = RayJobTrigger(
        submission_id=SID,
        ray_conn_id="my_ray",
        policy=policy.to_dict(),
        log_cursor=CURSOR.to_dict(),
        stream_logs=False,
        aws_conn_id="my_aws",
    )
    classpath, kwargs = trigger.serialize()
    assert classpath == "airflow_provider_horovod.triggers.ray.RayJobTrigger"
    assert LogCursor.from_dict(kwargs.pop("log_cursor"), SID) == CURSOR
    assert kwargs == {
        "submission_id": SID,
        "ray_conn_id": "my_ray",
        "stream_logs": False,
        "not_before": None,
        "aws_conn_id": "my_aws",
        "policy": {"poll_interval_s": 2.5, "pending_timeout_s": 60, "stall_timeout_s": 120},
    }
    assert trigger.policy == policy
    classpath, kwargs = trigger.serialize()
    assert json.loads(json.dumps(kwargs)) == kwargs  # what the triggerer stores
    assert RayJobTrigger(**kwargs).serialize() == (classpath, kwargs)


def test_defaults_and_a_cursor_of_another_job():
    other = LogCursor("ahp-dag-train-0123456789-a2").advanced(["x"] * 9).to_dict()
    _, kwargs = RayJobTrigger(submission_id=SID, log_cursor=other).serialize()
    assert LogCursor.from_dict(kwargs.pop("log_cursor"), SID) == LogCursor(SID)
    assert kwargs == {
        "submission_id": SID,
        "ray_conn_id": "ray_default",
        "stream_logs": True,
        "not_before": None,
        "aws_conn_id": None,
        "policy": {"poll_interval_s": 1.0, "pending_timeout_s": 600.0, "stall_timeout_s": None},
    }


@pytest.mark.parametrize(
    "kwargs, parameter",
    [
        ({"submission_id": ""}, "submission_id"),
        ({"submission_id": None}, "submission_id"),
        ({"submission_id": "x", "policy": {"poll_interval_s": 0}}, "poll_interval_seconds"),
        ({"submission_id": "x", "policy": {"poll_interval_s": "fast"}}, "poll_interval_seconds"),
        ({"submission_id": "x", "policy": {"poll_interval_s": True}}, "poll_interval_seconds"),
        ({"submission_id": "x", "policy": {"pending_timeout_s": -1}}, "pending_timeout_seconds"),
        ({"submission_id": "x", "policy": {"pending_timeout_s": "10"}}, "pending_timeout_seconds"),
    ],
)
def test_bad_arguments_are_refused_at_construction(kwargs, parameter):
    with pytest.raises(InvalidParameterError) as err:
        RayJobTrigger(**kwargs)
    assert err.value.parameter == parameter
    assert "give" in str(err.value)


def job(status, started_s_ago=0.0, **extra):
    return {
        "status": status,
        "message": f"msg-{status}",
        "start_time": (time.time() - started_s_ago) * 1000,
        "metadata": {},
        **extra,
    }


@pytest.fixture
def run(serve):
    """The trigger's events, its hook talking to ``ray`` served over HTTP (its dashboard as ``.dashboard``)."""

    def run_(trigger, ray, failures=()):
        dashboard = serve(ray, trigger.ray_conn_id)
        for prefix, status, after in failures:
            dashboard.fail(prefix, status, after=after)
        return asyncio.run(collect(trigger))

    return run_


def collect(trigger):
    async def collect():
        return [event async for event in trigger.run()]

    return collect()


def streamed(capsys) -> list[str]:
    """The job's log lines the trigger wrote to the task log (Airflow's logging writes to stdout)."""
    return re.findall(r"\[ray\] (\S+)", capsys.readouterr().out)


def test_run_streams_each_line_once_and_yields_one_event(run, monkeypatch, capsys):
    ray = FakeRay(
        {SID: [job("PENDING"), job("RUNNING"), job("RUNNING"), job("RUNNING"), job("SUCCEEDED")]},
        logs={SID: ["", "l1\nl2", "l1\nl2\nl3\n", "l1\nl2\nl3\n", "l1\nl2\nl3\nl4"]},
    )
    events = run(RayJobTrigger(submission_id=SID, policy=FAST), ray)
    assert len(events) == 1
    assert json.loads(json.dumps(events[0].payload)) == events[0].payload
    event = JobEvent.from_dict(events[0].payload)
    assert events[0].payload["outcome"] == "success"
    assert event.succeeded
    assert event.job_status is JobStatus.SUCCEEDED
    assert LogCursor.from_dict(event.log_cursor, SID).lines == 4
    assert LogCursor.from_dict(event.log_cursor, SID).tail == LogCursor(SID).advanced(["l1", "l2", "l3", "l4"]).tail
    assert streamed(capsys) == ["l1", "l2", "l3", "l4"]
    assert "get_job_logs" not in ray.calls  # read by windows of the log's end


def test_a_job_ending_right_after_the_deferral_holds_its_event_until_not_before(run, monkeypatch):
    # Airflow 3.3.2 fails a task resumed before it saw the deferring worker exit (apache/airflow#67287).
    ray = FakeRay({SID: [job("RUNNING"), job("SUCCEEDED")]}, logs={SID: ["", "done\n"]})
    started = time.time()
    trigger = with_task(RayJobTrigger(submission_id=SID, policy=FAST, not_before=started + 1.5), monkeypatch, XComs())
    events = run(trigger, ray)
    assert time.time() - started >= 1.5
    assert JobEvent.from_dict(events[0].payload).succeeded
    # Past it, nothing is held.
    ray = FakeRay({SID: [job("SUCCEEDED")]}, logs={SID: ["done\n"]})
    started = time.time()
    trigger = with_task(RayJobTrigger(submission_id=SID, policy=FAST, not_before=started - 60), monkeypatch, XComs())
    run(trigger, ray)
    assert time.time() - started < 1.5


def test_in_a_triggerer_the_event_waits_for_the_jobs_last_lines_to_reach_the_log(run, monkeypatch):
    # The triggerer closes the task's log file on the event; lines logged just before travel apart from it.
    from airflow_provider_horovod.triggers import ray as trigger_module

    ray = FakeRay({SID: [job("SUCCEEDED")]}, logs={SID: "the last line\n"})
    trigger = with_task(RayJobTrigger(submission_id=SID, policy=FAST), monkeypatch, XComs())
    written_at = []
    write = trigger._write

    async def noted(lines):
        await write(lines)
        written_at.append(time.monotonic())

    monkeypatch.setattr(trigger, "_write", noted)
    events = run(trigger, ray)
    assert time.monotonic() - written_at[-1] >= trigger_module.LOG_SETTLE_S
    assert JobEvent.from_dict(events[0].payload).succeeded


def test_a_burst_of_last_lines_gets_a_longer_settle_than_a_few(run, monkeypatch):
    # The triggerer files a burst slower: the lines of a restart's first read all came with the job's end.
    from airflow_provider_horovod.triggers import ray as trigger_module

    ends = {}
    for lines in (1, 400):
        ray = FakeRay({SID: [job("SUCCEEDED")]}, logs={SID: "".join(f"line {i}\n" for i in range(lines))})
        trigger = with_task(RayJobTrigger(submission_id=SID, policy=FAST), monkeypatch, XComs())
        written_at = []
        write = trigger._write

        async def noted(batch, write=write, written_at=written_at):
            await write(batch)
            written_at.append(time.monotonic())

        monkeypatch.setattr(trigger, "_write", noted)
        run(trigger, ray)
        ends[lines] = time.monotonic() - written_at[-1]
    assert ends[1] >= trigger_module.LOG_SETTLE_S
    assert ends[400] >= trigger_module.LOG_SETTLE_S + 400 * trigger_module.LOG_SETTLE_PER_LINE_S


def test_the_settle_counts_from_the_last_lines_written_not_from_the_jobs_end(run, monkeypatch):
    # Every part of the pause delays the task's end: lines written a settle's time before the end need none.
    from airflow_provider_horovod.triggers import ray as trigger_module

    monkeypatch.setattr(trigger_module, "LOG_SETTLE_S", 0.5)
    statuses = [job("RUNNING")] * 4 + [job("SUCCEEDED")]
    ray = FakeRay({SID: statuses}, logs={SID: ["the last line\n", "", "", "", ""]})
    slow = WaitPolicy(poll_interval_s=0.3).to_dict()
    trigger = with_task(RayJobTrigger(submission_id=SID, policy=slow), monkeypatch, XComs())
    ended_at = []
    wait = trigger.wait

    async def noted():
        event = await wait()
        ended_at.append(time.monotonic())
        return event

    monkeypatch.setattr(trigger, "wait", noted)
    events = run(trigger, ray)
    assert JobEvent.from_dict(events[0].payload).succeeded
    # The line was written four polls before the end: the event followed the end at once, not 0.5 s later.
    assert time.monotonic() - ended_at[0] < 0.4


def test_run_inline_without_a_triggerer_holds_nothing(run):
    # `airflow dags test` runs the trigger in the worker, which has already deferred: no race to guard.
    ray = FakeRay({SID: [job("RUNNING"), job("SUCCEEDED")]}, logs={SID: ["", "done\n"]})
    started = time.time()
    events = run(RayJobTrigger(submission_id=SID, policy=FAST, not_before=started + 30), ray)
    assert time.time() - started < 10
    assert JobEvent.from_dict(events[0].payload).succeeded


def test_a_serialized_cursor_repeats_no_line(run, monkeypatch, capsys):
    ray = FakeRay({SID: job("SUCCEEDED")}, logs={SID: "l1\nl2\nl3\n"})
    trigger = RayJobTrigger(submission_id=SID, log_cursor=LogCursor(SID).advanced(["l1", "l2"]).to_dict())
    rebuilt = RayJobTrigger(**json.loads(json.dumps(trigger.serialize()[1])))
    (event,) = run(rebuilt, ray)
    assert streamed(capsys) == ["l3"]
    assert LogCursor.from_dict(event.payload["log_cursor"], SID).lines == 3


def test_without_streaming_only_the_end_is_read(run, monkeypatch, capsys):
    ray = FakeRay({SID: [job("RUNNING"), job("FAILED")]}, logs={SID: "boom\n"})
    (event,) = run(RayJobTrigger(submission_id=SID, policy=FAST, stream_logs=False), ray)
    assert ray.tail_reads == [(SID, LOG_TAIL_LINES)]
    assert "get_job_logs" not in ray.calls
    assert event.payload["outcome"] == "error"
    assert event.payload["log_tail"] == ["boom"]
    assert streamed(capsys) == []


def test_pending_too_long_stops_the_job_and_says_what_was_asked(run, monkeypatch):
    ray = FakeRay(
        {SID: job("PENDING", started_s_ago=90, metadata={META_RESOURCES: '{"GPU": 4.0}'})}, cluster={"CPU": 8.0}
    )
    (event,) = run(RayJobTrigger(submission_id=SID, policy={"pending_timeout_s": 30}), ray)
    payload = event.payload
    assert payload["outcome"] == "error"
    assert payload["job_status"] == "PENDING"
    assert "stayed PENDING for 90 s" in payload["message"]
    assert 'ask for {"GPU": 4.0}' in payload["message"]
    assert 'the cluster has {"CPU": 8.0}' in payload["message"]
    assert ray.stopped == [SID]


def test_pending_too_long_when_the_cluster_cannot_say_what_it_has(run):
    ray = FakeRay({SID: job("PENDING", started_s_ago=90)})
    (event,) = run(
        RayJobTrigger(submission_id=SID, policy={"pending_timeout_s": 30}), ray, failures=[("/api/v0/nodes", 500, 0)]
    )
    assert "the cluster has unknown" in event.payload["message"]
    assert ray.stopped == [SID]


def test_a_missing_job_yields_an_error_event(run):
    (event,) = run(RayJobTrigger(submission_id=SID), FakeRay())
    assert event.payload["outcome"] == "error"
    assert f"Ray job {SID} does not exist" in event.payload["message"]


def test_a_provider_error_becomes_one_error_event(run):
    ray = FakeRay({SID: [job("RUNNING")]}, logs={SID: "l1\n"})
    # The job's info answers once, then the dashboard fails it.
    (event,) = run(RayJobTrigger(submission_id=SID, policy=FAST), ray, failures=[(f"/api/jobs/{SID}", 500, 1)])
    assert event.payload["outcome"] == "error"
    assert "job info failed: HTTP 500" in event.payload["message"]
    assert LogCursor.from_dict(event.payload["log_cursor"], SID).lines == 1  # the line streamed before


def test_on_kill_stops_the_job(serve):
    ray = FakeRay({SID: job("RUNNING")})
    serve(ray)
    asyncio.run(RayJobTrigger(submission_id=SID).on_kill())
    assert ray.stopped == [SID]


def test_on_kill_of_a_job_still_pending_keeps_the_attempts_record(serve, tmp_path):
    """Ray would start its driver only to stop it before the entrypoint runs: the trigger keeps the record."""
    uri = str(tmp_path / "attempt-1" / "result.json")
    meta = {"ahp_storage_uri": str(tmp_path), "ahp_attempt": "1", "ahp_result_uri": uri}
    ray = FakeRay({SID: job("PENDING", metadata=meta)})
    serve(ray)
    asyncio.run(RayJobTrigger(submission_id=SID).on_kill())
    assert ray.stopped == [SID]
    record = json.loads((tmp_path / "attempt-1" / "result.json").read_text())
    assert (record["submission_id"], record["failure"]["failure_class"]) == (SID, "infrastructure")


class XComs:
    """The triggerer's XComs of the task (compat.trigger_xcom_get/set), in memory."""

    def __init__(self, saved=None):
        self.values = {} if saved is None else {XCOM_LOG_CURSOR: saved}
        self.sets: list[dict] = []

    async def get(self, key, **ids):
        assert ids == {"dag_id": "dag", "task_id": "train", "run_id": FakeTI().run_id, "map_index": -1}
        return self.values.get(key)

    async def set(self, key, value, **ids):
        self.values[key] = value
        self.sets.append(value)


def with_task(trigger, monkeypatch, xcoms):
    trigger.task_instance = FakeTI()
    monkeypatch.setattr(compat, "trigger_xcom_get", xcoms.get)
    monkeypatch.setattr(compat, "trigger_xcom_set", xcoms.set)
    return trigger


def test_the_cursor_is_saved_before_the_lines_it_counts_are_written(run, monkeypatch):
    ray = FakeRay(
        {SID: [job("RUNNING"), job("RUNNING"), job("SUCCEEDED")]}, logs={SID: ["a\n", "a\nb\nc\n", "a\nb\nc\nd\n"]}
    )
    xcoms = XComs()
    trigger = with_task(RayJobTrigger(submission_id=SID, policy=FAST), monkeypatch, xcoms)
    order = []
    monkeypatch.setattr(trigger.log, "log", lambda level, line, *args: order.append(("write", line)))
    real_set = xcoms.set

    async def recorded_set(key, value, **ids):
        order.append(("save", LogCursor.from_dict(value, SID).lines))
        await real_set(key, value, **ids)

    monkeypatch.setattr(compat, "trigger_xcom_set", recorded_set)
    (event,) = run(trigger, ray)
    assert order == [
        ("save", 1),
        ("write", "[ray] a"),
        ("save", 3),
        ("write", "[ray] b"),
        ("write", "[ray] c"),
        ("save", 4),
        ("write", "[ray] d"),
    ]
    assert LogCursor.from_dict(xcoms.values[XCOM_LOG_CURSOR], SID) == LogCursor.from_dict(
        event.payload["log_cursor"], SID
    )


def test_a_restarted_trigger_continues_from_the_saved_cursor_not_its_kwargs(run, monkeypatch, capsys):
    lines = [f"l{i}" for i in range(1, 61)]
    text = "\n".join(lines) + "\n"
    ray = FakeRay({SID: [job("RUNNING"), job("SUCCEEDED")]}, logs={SID: text})
    # Deferred at line 5; before the restart the first trigger streamed (and saved) 50 lines.
    saved = LogCursor(SID).advanced(lines[:50]).to_dict()
    trigger = RayJobTrigger(submission_id=SID, log_cursor=LogCursor(SID).advanced(lines[:5]).to_dict(), policy=FAST)
    (event,) = run(with_task(trigger, monkeypatch, XComs(saved)), ray)
    assert streamed(capsys) == lines[50:]
    assert LogCursor.from_dict(event.payload["log_cursor"], SID).lines == 60


@pytest.mark.parametrize("saved", [None, {"submission_id": "ahp-dag-train-0123456789-a2", "lines": 50}])
def test_a_saved_cursor_of_another_job_or_none_leaves_the_kwargs_cursor(run, monkeypatch, capsys, saved):
    lines = [f"l{i}" for i in range(1, 11)]
    ray = FakeRay({SID: job("SUCCEEDED")}, logs={SID: "\n".join(lines) + "\n"})
    trigger = RayJobTrigger(submission_id=SID, log_cursor=LogCursor(SID).advanced(lines[:5]).to_dict())
    run(with_task(trigger, monkeypatch, XComs(saved)), ray)
    assert streamed(capsys) == lines[5:]


def test_unreadable_xcoms_do_not_fail_the_wait(run, monkeypatch, capsys):
    ray = FakeRay({SID: job("SUCCEEDED")}, logs={SID: "a\nb\n"})
    trigger = RayJobTrigger(submission_id=SID)
    trigger.task_instance = FakeTI()

    async def broken(*args, **kwargs):
        raise RuntimeError("no API server")

    monkeypatch.setattr(compat, "trigger_xcom_get", broken)
    monkeypatch.setattr(compat, "trigger_xcom_set", broken)
    (event,) = run(trigger, ray)
    assert event.payload["outcome"] == "success"
    assert streamed(capsys) == ["a", "b"]


def test_many_lines_of_one_poll_leave_the_event_loop_to_other_triggers_between_slices(monkeypatch):
    trigger = RayJobTrigger(submission_id=SID)
    order: list[str] = []
    per_line_s = WRITE_SLICE_S / 2.5

    def log(level, line, *args):  # a slow logger: each line holds the loop this long
        time.sleep(per_line_s)
        order.append("line")

    monkeypatch.setattr(trigger.log, "log", log)

    async def other():  # another trigger of the same loop
        while True:
            order.append("other")
            await asyncio.sleep(0)

    async def both():
        neighbour = asyncio.create_task(other())
        await asyncio.sleep(0)
        try:
            await trigger._write([(20, f"line {i}") for i in range(30)])
        finally:
            neighbour.cancel()

    asyncio.run(both())
    lines_in_a_row = [len(run) for run in "".join("l" if item == "line" else " " for item in order).split()]
    assert sum(lines_in_a_row) == 30
    # The neighbour ran once the writes had taken a slice: after three lines at most, whatever the machine.
    assert max(lines_in_a_row) <= 3, lines_in_a_row
