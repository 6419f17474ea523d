"""A scripted Ray dashboard on a real HTTP server (``unit.fakes.HttpStandIn``), for the RayHook tests of
this folder (test_ray.py, test_ray_auth_and_retries.py, test_ray_submit.py); their fixtures are in
conftest.py."""

from __future__ import annotations

import asyncio
import json
from http.server import BaseHTTPRequestHandler

from airflow_provider_horovod.hooks.ray import RayHook
from unit.fakes import HttpStandIn

TOKEN = "tok-0d6b2a9c4e8f1357"


NODES = {
    "data": {
        "result": {
            "result": [
                {"state": "ALIVE", "resources_total": {"CPU": 4.0, "memory": 1e9, "node:10.0.0.1": 1.0}},
                {"state": "ALIVE", "resources_total": {"CPU": 2.0, "GPU": 1.0}},
                {"state": "DEAD", "resources_total": {"GPU": 8.0}},
            ]
        }
    }
}


class Dashboard(HttpStandIn):
    """A tiny Ray dashboard: answers each (method, path) from a script (the last answer repeats),
    404 for anything unscripted, and records every request and the connection it came on. A path
    scripted without a query answers whatever query it is asked with."""

    def __init__(self):
        self.routes: dict[tuple[str, str], list[tuple[int, str]]] = {}
        self.requests: list[dict] = []
        self.answer("GET", "/api/version", 200, {"ray_version": "2.60.0", "version": "4"})
        super().__init__()

    def respond(self, request: BaseHTTPRequestHandler, body: bytes) -> tuple[int, bytes]:
        method, path = request.command, request.path
        self.requests.append(
            {
                "method": method,
                "path": path,
                "body": body,
                "headers": dict(request.headers),
                "peer": request.client_address,
            }
        )
        script = self.routes.get((method, path)) or self.routes.get((method, path.split("?", 1)[0]))
        status, text = (script.pop(0) if len(script) > 1 else script[0]) if script else (404, "not found")
        return status, text.encode()

    def answer(self, method: str, path: str, *answers) -> None:
        """Answers as (status, body) pairs, or a status and a body for one answer."""
        if answers and isinstance(answers[0], int):
            answers = (answers,)
        self.routes[(method, path)] = [(s, b if isinstance(b, str) else json.dumps(b)) for s, b in answers]

    def asked(self, method: str, path: str) -> list[dict]:
        return [r for r in self.requests if (r["method"], r["path"]) == (method, path)]

    def asked_with_query(self, method: str, path: str) -> list[dict[str, list[str]]]:
        """The queries of the requests for ``path``, whatever their query."""
        from urllib.parse import parse_qs, urlsplit

        return [
            parse_qs(urlsplit(r["path"]).query)
            for r in self.requests
            if r["method"] == method and urlsplit(r["path"]).path == path
        ]


def set_connection(monkeypatch, conn_id: str, port: int, **fields) -> str:
    conn = {"conn_type": "ray", "host": "127.0.0.1", "port": port, "schema": "http", "password": TOKEN, **fields}
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(conn))
    return conn_id


def arun(coro, hook: RayHook | None = None):
    """Run ``coro``; with ``hook``, close the hook's async session after it, as a trigger does."""

    async def closing():
        try:
            return await coro
        finally:
            await hook.aclose()

    return asyncio.run(closing() if hook is not None else coro)


LOG_FILE = "/api/v0/logs/file"
