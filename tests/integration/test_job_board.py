"""The statuses of many jobs waited for in one event loop (a triggerer's) come from one State API list
of the cluster's unended jobs: against a real Ray head, with token auth on."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from airflow_provider_horovod.hooks.ray import RayHook
from airflow_provider_horovod.hooks.ray_transport import BATCH_FROM
from harness.tasks import HUNG_S

pytestmark = pytest.mark.integration

USED = ("status", "start_time", "end_time", "metadata", "driver_node_id", "error_type", "driver_exit_code")


def test_many_waiting_jobs_read_their_statuses_from_one_list(ray_hook, monkeypatch):
    running = f"board-run-{uuid.uuid4().hex[:8]}"
    ended = f"board-end-{uuid.uuid4().hex[:8]}"
    ray_hook.submit_job(entrypoint="sleep 300", submission_id=running, metadata={"k": "v"})
    ray_hook.submit_job(entrypoint="true", submission_id=ended)
    deadline = time.monotonic() + HUNG_S
    while (ray_hook.get_job_status(running), ray_hook.get_job_status(ended)) != ("RUNNING", "SUCCEEDED"):
        assert time.monotonic() < deadline, "the two jobs did not start and end"
        time.sleep(0.3)
    gone = [f"board-gone-{i}" for i in range(BATCH_FROM - 2)]  # deleted, or never there
    sids = [running, ended, *gone]
    paths: list[str] = []
    lists: list[int] = []
    request = RayHook._a_request

    async def counted(self, route, **options):
        paths.append(route.split(options)[0])
        return await request(self, route, **options)

    monkeypatch.setattr(RayHook, "_a_request", counted)

    async def poll_all():
        hooks = [RayHook() for _ in sids]  # one per trigger, as in a triggerer: they share a session and board
        try:
            first = await asyncio.gather(*(h.a_get_job_info(s, fresh_within_s=30) for h, s in zip(hooks, sids)))
            lists.append(paths.count("/api/v0/jobs"))
            paths.clear()
            second = await asyncio.gather(*(h.a_get_job_info(s, fresh_within_s=30) for h, s in zip(hooks, sids)))
            own = await hooks[0].a_get_job_info(running)
            return first, second, own
        finally:
            for hook in hooks:
                await hook.aclose()

    try:
        first, second, own = asyncio.run(poll_all())
    finally:
        ray_hook.stop_job(running)
    # One list, once the tenth job asked (the first nine asked for their own, the board counting them);
    # then, within fresh_within_s, no request for the running job: only the ended job and those gone
    # ask for their own.
    assert lists == [1]
    assert "/api/v0/jobs" not in paths
    assert sorted(p for p in paths if p != "/api/v0/jobs") == sorted(
        f"/api/jobs/{sid}" for sid in [ended, *gone, running]
    )  # the last: `own`
    assert second[0]["submission_id"] == running
    assert {k: second[0][k] for k in USED} == {k: own[k] for k in USED}
    assert second[0]["status"] == "RUNNING"
    assert second[0]["metadata"] == {"k": "v"}
    assert second[1]["status"] == "SUCCEEDED"
    assert second[2:] == [None] * len(gone)
    assert [info and info["status"] for info in first] == [info and info["status"] for info in second]
