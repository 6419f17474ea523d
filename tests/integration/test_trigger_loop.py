"""The provider's triggers never hold the triggerer's event loop: a hundred ``RayJobTrigger``s in one
loop, in a fresh interpreter (first imports and the HTTP session made in the loop, as in a new
triggerer), following real jobs on a real Ray head that print lines as they run, while two processes
keep every core of the machine busy. ``support.loop_watch`` times each callback of the loop by the
kernel's account of the thread (on a CPU, waiting for one, asleep), so a loaded machine does not pass
for a blocking trigger, nor hide one."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest
from support.loop_watch import schedstat_available

from harness.tasks import HUNG_S, wait_for_status

pytestmark = pytest.mark.integration

JOBS = 5
TRIGGERS_PER_JOB = 20
THRESHOLD_S = 0.1
TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A burst at the start (a poll may bring a thousand lines), then a line every 0.25 s.
JOB = (
    "python -c \"import time\nprint(''.join(f'start {i} ' + 'x' * 80 + chr(10) for i in range(1000)), flush=True)\n"
    "for i in range(20): print('step', i, 'x' * 80, flush=True); time.sleep(0.25)\""
)

LOOP = """
import asyncio, importlib, json, sys, time
sys.path.insert(0, sys.argv[3])
from support.loop_watch import watched

import airflow.jobs.triggerer_job_runner  # what a triggerer has loaded before it runs a trigger

sids, threshold = json.loads(sys.argv[1]), float(sys.argv[2])
# Loaded as a triggerer is before its first trigger: the test loads the machine, then says go.
print("AHP_READY", flush=True)
sys.stdin.readline()


async def main():
    # As the triggerer does: the trigger's class imported (Airflow's own modules are loaded already),
    # then each trigger made and run, in the loop.
    module = importlib.import_module("airflow_provider_horovod.triggers.ray")
    triggers = [module.RayJobTrigger(submission_id=sid, policy={"poll_interval_s": 1.0}) for sid in sids]

    async def first_event(trigger):
        async for event in trigger.run():
            return event.payload

    lags, stop = [], asyncio.Event()

    async def watchdog():  # the triggerer's own check: how late a 0.1 s sleep wakes up
        while not stop.is_set():
            started = time.monotonic()
            await asyncio.sleep(0.1)
            lags.append(time.monotonic() - started - 0.1)

    dog = asyncio.create_task(watchdog())
    events = await asyncio.gather(*(first_event(t) for t in triggers))
    stop.set()
    await dog
    return events, max(lags)


with watched(threshold) as watch:
    events, worst_lag = asyncio.run(main())
print("AHP_LOOP " + json.dumps({
    "outcomes": [e["outcome"] for e in events],
    "statuses": [e["job_status"] for e in events],
    "slow": [s.__dict__ for s in watch.slow],
    "longest": {**watch.longest.__dict__, "held_s": watch.longest.held_s},
    "worst_watchdog_lag_s": worst_lag,
}))
"""


def burn() -> list[subprocess.Popen]:
    """Every core busy for the test's length."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(max(2, os.cpu_count() or 2))]


@pytest.mark.skipif(not schedstat_available(), reason="needs /proc/thread-self/schedstat (Linux)")
def test_a_hundred_triggers_never_block_their_loop_on_a_loaded_machine(ray_hook, tmp_path):
    token = uuid.uuid4().hex[:8]
    jobs = [ray_hook.submit_job(entrypoint=JOB, submission_id=f"loop-{token}-{i}") for i in range(JOBS)]
    sids = [sid for sid in jobs for _ in range(TRIGGERS_PER_JOB)]
    # The loop's console goes to files, as a triggerer's logs do: a pipe to this process (9 MB of lines)
    # would block the loop's writes whenever this process waits for a CPU, the test's stall, not a trigger's.
    # In memory where there is a tmpfs: on a disk busy with other runs the kernel throttles a writer of
    # that much (seen: a trigger's step asleep 0.27 s in a write, 0.7 ms of CPU), the disk's stall.
    logs = Path(tempfile.mkdtemp(dir="/dev/shm")) if os.path.isdir("/dev/shm") else tmp_path
    out, err = logs / "loop.out", logs / "loop.err"
    burners = []
    with out.open("w") as stdout, err.open("w") as stderr:
        loop = subprocess.Popen(
            [sys.executable, "-c", LOOP, json.dumps(sids), str(THRESHOLD_S), TESTS],
            stdin=subprocess.PIPE,
            stdout=stdout,
            stderr=stderr,
            text=True,
            env=os.environ,
        )
    try:
        # The cores are kept busy from the loop's start, not through the interpreter's imports before it.
        deadline = time.monotonic() + HUNG_S
        while "AHP_READY" not in out.read_text() and loop.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        # The jobs started before the cores are taken: what is loaded is the triggers' loop, not Ray's start
        # of the jobs (its workers run at niceness 15, below the burners).
        for sid in jobs:
            wait_for_status(ray_hook, sid, {"RUNNING", "SUCCEEDED"})
        burners = burn()
        loop.communicate("go\n", timeout=HUNG_S)
    finally:
        for process in (loop, *burners):
            process.kill()
            process.wait()
    written = out.read_text() + err.read_text()
    if logs != tmp_path:  # kept with the test's files
        shutil.copytree(logs, tmp_path / "loop-logs")
        shutil.rmtree(logs)
        out, err = tmp_path / "loop-logs" / "loop.out", tmp_path / "loop-logs" / "loop.err"
    assert loop.returncode == 0, err.read_text()[-3000:]
    (line,) = [ln for ln in out.read_text().splitlines() if ln.startswith("AHP_LOOP ")]
    seen = json.loads(line.split(" ", 1)[1])
    assert seen["outcomes"] == ["success"] * len(sids)
    assert set(seen["statuses"]) == {"SUCCEEDED"}
    # Every trigger wrote its job's lines through Airflow's logging (structlog, to the console here).
    assert written.count("step 19 ") == len(sids)
    assert written.count("start 999 ") == len(sids)
    # Nothing in the loop computed or slept for longer than the threshold; the watchdog's lag (printed
    # for the record, with the longest callback) is the machine's load.
    print(f"worst watchdog lag on the loaded machine: {seen['worst_watchdog_lag_s']:.3f} s")
    print("longest callback:", json.dumps(seen["longest"]))
    assert seen["slow"] == [], json.dumps(seen["slow"], indent=1)
