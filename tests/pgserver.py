"""A private PostgreSQL server on a loopback port, for tests and benchmarks.

Started with initdb + pg_ctl in a temporary directory. As root (CI), the server runs as the
``postgres`` OS user, because PostgreSQL refuses to run as root.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time


def find_pg_bindir() -> str:
    for candidate in [os.environ.get("UPSERT_PG_BINDIR", "")] + sorted(
        glob.glob("/usr/lib/postgresql/*/bin"), reverse=True
    ):
        if candidate and os.path.exists(os.path.join(candidate, "pg_ctl")):
            return candidate
    found = shutil.which("pg_ctl")
    if found:
        return os.path.dirname(os.path.realpath(found))
    raise RuntimeError(
        "PostgreSQL server binaries not found (initdb, pg_ctl): install them with "
        "`apt-get install postgresql` (.ci/run does) or set UPSERT_PG_BINDIR"
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class PostgresServer:
    def __init__(self) -> None:
        self.bindir = find_pg_bindir()
        self.dir = tempfile.mkdtemp(prefix="upsert-pg-")
        self.data = os.path.join(self.dir, "data")
        self.port = free_port()
        self.user = "upsert"
        self.password = "s3cret-pw"
        self._as_postgres = os.geteuid() == 0

    def _run(self, *args: str) -> None:
        cmd = list(args)
        if self._as_postgres:
            cmd = ["runuser", "-u", "postgres", "--"] + cmd
        subprocess.run(cmd, check=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    def start(self) -> "PostgresServer":
        if self._as_postgres:
            entry = pwd.getpwnam("postgres")
            os.chown(self.dir, entry.pw_uid, entry.pw_gid)
        pwfile = os.path.join(self.dir, "pw")
        with open(pwfile, "w") as handle:
            handle.write(self.password)
        if self._as_postgres:
            os.chown(pwfile, pwd.getpwnam("postgres").pw_uid, -1)
        self._run(
            os.path.join(self.bindir, "initdb"), "-D", self.data, "-U", self.user,
            "--pwfile", pwfile, "-A", "scram-sha-256", "--no-sync",
        )
        self._run(
            os.path.join(self.bindir, "pg_ctl"), "-D", self.data, "-w", "-t", "60",
            "-l", os.path.join(self.dir, "server.log"),
            "-o", f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c max_connections=200",
            "start",
        )
        return self

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{self.user}:{self.password}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        try:
            self._run(os.path.join(self.bindir, "pg_ctl"), "-D", self.data, "-m", "immediate", "stop")
        except subprocess.CalledProcessError:
            pass
        shutil.rmtree(self.dir, ignore_errors=True)


def wait_for(predicate, timeout: float = 30.0, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return False
