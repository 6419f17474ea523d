"""The Ray dashboard's routes the hook calls: each request's method and path, and how its answer is read
(a 404 that means "none", the field that holds the value). Pure: no request is made here."""

from __future__ import annotations

import dataclasses
import json
import string
from collections.abc import Callable
from typing import Any

from airflow_provider_horovod.exceptions import RayJobError

# What a 404 answers where the route says nothing: an error, as any other status from 400 up.
FAIL: Any = object()


@dataclasses.dataclass(frozen=True)
class Route:
    """One endpoint of the Ray dashboard, and how its answer is read: the same for a call and its async
    twin, so a route is written once. ``path`` may name values (``{submission_id}``) the call fills in."""

    method: str
    path: str
    what: str  # what the request does, for its error
    missing: Any = FAIL  # what a 404 means (None: no such job), before ``read``
    read: Callable[[Any], Any] = lambda answer: answer  # the call's value, from the answer's JSON

    def split(self, request: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """(the path with its values filled in, the other options of the request)."""
        names = {name for _, name, _, _ in string.Formatter().parse(self.path) if name}
        return self.path.format(**{n: request[n] for n in names}), {k: v for k, v in request.items() if k not in names}

    def answer(self, status: int, text: str) -> Any:
        """The call's value from the answer; a RayJobError for a failed request."""
        if status == 404 and self.missing is not FAIL:
            return self.read(self.missing)
        if status >= 400:
            raise RayJobError(f"Ray dashboard {self.what} failed: HTTP {status}: {text[:500]}")
        return self.read(json.loads(text) if text else {})


def total_resources(nodes: list[dict]) -> dict[str, float]:
    """Resources of the alive nodes, summed (``node:<ip>`` markers left out)."""
    total: dict[str, float] = {}
    for node in nodes:
        if node.get("state") != "ALIVE":
            continue
        for name, amount in (node.get("resources_total") or {}).items():
            if not name.startswith("node:"):
                total[name] = total.get(name, 0.0) + float(amount)
    return total


def _state_api_rows(answer: dict) -> list[dict]:
    return answer["data"]["result"]["result"]


# The Jobs API and the State API, as the hook calls them.
VERSION = Route("GET", "/api/version", "version check")
JOB_INFO = Route("GET", "/api/jobs/{submission_id}", "job info", missing=None)
JOB_LOGS = Route("GET", "/api/jobs/{submission_id}/logs", "job logs", missing={}, read=lambda a: a.get("logs", ""))
STOP_JOB = Route("POST", "/api/jobs/{submission_id}/stop", "stop", missing={}, read=lambda a: bool(a.get("stopped")))
DELETE_JOB = Route("DELETE", "/api/jobs/{submission_id}", "delete", missing={}, read=lambda a: bool(a.get("deleted")))
SUBMIT_JOB = Route("POST", "/api/jobs/", "submission")
JOB_LIST = Route("GET", "/api/jobs/", "job list")
JOB_LIST_DETAILED = Route("GET", "/api/v0/jobs", "job list", read=_state_api_rows)
NODES = Route(
    "GET", "/api/v0/nodes?detail=1&limit=10000", "node list", read=lambda a: total_resources(_state_api_rows(a))
)
LOG_FILE = Route("GET", "/api/v0/logs/file", "log read")
PACKAGE = Route("GET", "/api/packages/{protocol}/{name}", "package check")
UPLOAD_PACKAGE = Route("PUT", "/api/packages/{protocol}/{name}", "upload")
