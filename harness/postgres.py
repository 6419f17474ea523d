"""A PostgreSQL server of the harness's own, as Airflow deployments run their metadata database on:
Debian's server binaries, a data folder of its own, listening on 127.0.0.1 only, run as the
``postgres`` user (the server refuses to run as root).

    with Postgres(folder) as pg:
        url = pg.create_database("stack")          # postgresql+psycopg2://... for Airflow
        pg.create_database("copy", template="stack")  # a copy, in a fraction of a second

``scripts/setup_postgres.sh`` installs Debian's ``postgresql`` package where it is missing.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import time
from pathlib import Path

from harness.ports import free_port

USER = "postgres"


def server_bin() -> Path | None:
    """The newest Debian PostgreSQL server's binaries folder, or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(p.split("/")[4]))
    return Path(found[-1]).parent if found else None


def unavailable_reason() -> str | None:
    if server_bin() is None:
        return "no PostgreSQL server: scripts/setup_postgres.sh installs Debian's postgresql package"
    try:
        pwd.getpwnam(USER)
    except KeyError:
        return f"no {USER!r} user (Debian's postgresql package makes it)"
    if os.geteuid() != 0:
        return "the harness starts PostgreSQL as the postgres user, which needs root"
    return None


class Postgres:
    def __init__(self, folder: Path, port: int | None = None):
        self.folder = Path(folder)
        self.data = self.folder / "data"
        self.port = port or free_port()
        self.bin = server_bin()
        self.log = self.folder / "postgres.log"

    def _as_user(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["runuser", "-u", USER, "--", *args], capture_output=True, text=True, check=check, timeout=timeout
        )

    def start(self) -> Postgres:
        why = unavailable_reason()
        if why:
            raise RuntimeError(why)
        user = pwd.getpwnam(USER)
        self.folder.mkdir(parents=True, exist_ok=True)
        os.chown(self.folder, user.pw_uid, user.pw_gid)
        if not (self.data / "PG_VERSION").exists():
            # fsync off: a test database need not survive the machine's crash, and it saves seconds.
            self._as_user(
                str(self.bin / "initdb"), "-D", str(self.data), "-U", USER, "--auth=trust", "-E", "UTF8", "--no-sync"
            )
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.folder} -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off -c max_connections=300"
        )
        self._as_user(
            str(self.bin / "pg_ctl"),
            "-D",
            str(self.data),
            "-l",
            str(self.log),
            "-o",
            options,
            "-w",
            "-t",
            "60",
            "start",
        )
        return self

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self._as_user(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop", check=False)

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> Postgres:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def psql(self, sql: str, database: str = "postgres") -> str:
        done = self._as_user(
            str(self.bin / "psql"),
            "-h",
            "127.0.0.1",
            "-p",
            str(self.port),
            "-U",
            USER,
            "-d",
            database,
            "-v",
            "ON_ERROR_STOP=1",
            "-Atc",
            sql,
        )
        return done.stdout.strip()

    def url(self, database: str) -> str:
        """SQLAlchemy's URL of a database, as Airflow's ``[database] sql_alchemy_conn`` takes it."""
        return f"postgresql+psycopg2://{USER}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str, template: str | None = None) -> str:
        """A new database (a copy of ``template``, which nobody may be connected to); its URL."""
        self.psql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        self.psql(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))
        return self.url(name)

    def wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if (
                self._as_user(
                    str(self.bin / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port), check=False
                ).returncode
                == 0
            ):
                return
            time.sleep(0.2)
        raise RuntimeError(f"PostgreSQL did not start: {self.log.read_text()[-2000:] if self.log.exists() else ''}")
