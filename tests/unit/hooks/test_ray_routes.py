"""The dashboard's routes: a route fills its path and reads its answer as it says; the node list read
as the cluster's total resources."""

from __future__ import annotations

import pytest

from airflow_provider_horovod.exceptions import RayJobError
from airflow_provider_horovod.hooks.ray_routes import JOB_INFO, JOB_LOGS, Route, total_resources
from airflow_provider_horovod.hooks.ray_routes import NODES as NODES_ROUTE
from unit.hooks.dashboard import NODES


def test_a_route_fills_its_path_and_reads_its_answer_as_it_says():
    assert JOB_LOGS.split({"submission_id": "sid-a1", "params": {"x": 1}}) == (
        "/api/jobs/sid-a1/logs",
        {"params": {"x": 1}},
    )
    assert NODES_ROUTE.split({}) == ("/api/v0/nodes?detail=1&limit=10000", {})
    assert JOB_LOGS.answer(200, '{"logs": "a\\n"}') == "a\n"
    assert JOB_LOGS.answer(404, "not found") == ""
    assert JOB_INFO.answer(404, "not found") is None
    assert JOB_INFO.answer(200, "") == {}
    with pytest.raises(RayJobError, match="upload failed: HTTP 404: gone"):
        Route("PUT", "/api/packages/{name}", "upload").answer(404, "gone")
    with pytest.raises(RayJobError, match="job info failed: HTTP 500: trouble"):
        JOB_INFO.answer(500, "trouble")


def test_total_resources_of_the_alive_nodes():
    assert total_resources(NODES["data"]["result"]["result"]) == {"CPU": 6.0, "memory": 1e9, "GPU": 1.0}
    assert total_resources([]) == {}
