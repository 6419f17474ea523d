"""A small real HTTP server standing in for the Ray dashboard, for the RayHook tests of this folder
(test_ray.py, test_ray_auth_and_retries.py, test_ray_submit.py); their fixtures are in conftest.py."""

from __future__ import annotations

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from airflow_provider_horovod.hooks.ray import RayHook

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


class Dashboard:
    """A tiny Ray dashboard: answers each (method, path) from a script (the last answer repeats),
    404 for anything unscripted, and records every request and the connection it came on. A path
    scripted without a query answers whatever query it is asked with."""

    def __init__(self):
        self.routes: dict[tuple[str, str], list[tuple[int, str]]] = {}
        self.requests: list[dict] = []
        self.answer("GET", "/api/version", 200, {"ray_version": "2.60.0", "version": "4"})
        dashboard = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as Ray's dashboard (aiohttp) does

            def log_message(self, *args):
                pass

            def handle_one(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                dashboard.requests.append(
                    {
                        "method": self.command,
                        "path": self.path,
                        "body": body,
                        "headers": dict(self.headers),
                        "peer": self.client_address,
                    }
                )
                script = dashboard.routes.get((self.command, self.path)) or dashboard.routes.get(
                    (self.command, self.path.split("?", 1)[0])
                )
                status, text = (script.pop(0) if len(script) > 1 else script[0]) if script else (404, "not found")
                data = text.encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = handle_one

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()

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

    def close(self):
        self.server.shutdown()
        self.server.server_close()


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
