"""A real S3-protocol server for tests and benchmarks: moto's server mode, on one address.

    with MotoServer() as s3:
        os.environ.update(s3.env())     # what a client (boto3, pyarrow, a Ray head) needs to reach it
        s3.make_bucket("checkpoints")

In a thread of this process by default; ``own_process=True`` runs it as a process of its own, for
measurements (in this process it would share the GIL with what is measured).
"""

from __future__ import annotations

import logging
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from harness.ports import free_port

# moto accepts any keys; these say so wherever they show.
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


class MotoServer:
    def __init__(
        self, address: str = "127.0.0.1", port: int | None = None, *, own_process: bool = False, log: Path | None = None
    ):
        self.address = address
        self.port = port or free_port(address)
        self.endpoint_url = f"http://{address}:{self.port}"
        self.own_process, self.log = own_process, log
        self._server = None
        self._process: subprocess.Popen | None = None

    def start(self) -> MotoServer:
        if self.own_process:
            out = open(self.log, "w") if self.log else subprocess.DEVNULL  # noqa: SIM115 - the process holds it
            self._process = subprocess.Popen(
                [str(Path(sys.executable).with_name("moto_server")), "-H", self.address, "-p", str(self.port)],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
            self._wait_until_up()
            return self
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per S3 request otherwise
        self._server = ThreadedMotoServer(ip_address=self.address, port=self.port, verbose=False)
        self._server.start()
        return self

    def _wait_until_up(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                urllib.request.urlopen(self.endpoint_url, timeout=1).read()
                return
            except OSError:
                if time.monotonic() > deadline or (self._process and self._process.poll() is not None):
                    raise RuntimeError(f"moto_server did not start on {self.endpoint_url} (log: {self.log})") from None
                time.sleep(0.2)

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:
                self._process.kill()
            self._process = None

    def __enter__(self) -> MotoServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def env(self) -> dict[str, str]:
        """The environment of a client of this server: its endpoint and moto's test credentials."""
        return {"AWS_ENDPOINT_URL": self.endpoint_url, **CREDENTIALS, "AWS_EC2_METADATA_DISABLED": "true"}

    def client(self):
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name=CREDENTIALS["AWS_DEFAULT_REGION"],
            aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        )

    def make_bucket(self, name: str) -> str:
        self.client().create_bucket(Bucket=name)
        return name
