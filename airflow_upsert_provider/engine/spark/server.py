"""A local Spark Connect server on loopback, started from the installed ``pyspark``.

Every Airflow task is a fresh process; in-process Spark makes each one pay a JVM start and a
cold first job. A Connect server started once keeps a warm JVM that fresh clients reach in
well under a second (``upsertctl --remote sc://127.0.0.1:15002 ...``).

State lives in one directory (``$UPSERT_STATE_DIR/spark-server``, default
``./.upsert/spark-server``): ``server.json`` (pid, port, log file, start time), ``server.log``
(the server's stdout and stderr) and ``lock``. Every start and stop takes an exclusive
``fcntl`` lock on ``lock`` first, so that two tasks starting the server at once leave one
server: the loser waits for the lock, then finds the winner's server running and reports it.

Nothing here imports pyspark's JVM side: the server is ``spark-submit --class
org.apache.spark.sql.connect.service.SparkConnectServer`` from ``$SPARK_HOME/bin``, where
``SPARK_HOME`` is the installed pyspark package (the ``spark-connect`` jar ships in it).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Iterator, Mapping

from airflow_upsert_provider.engine.common.atomic_file import write_atomically
from airflow_upsert_provider.engine.common.connect_address import (  # noqa: F401 (the server's names)
    DEFAULT_PORT,
    check_port,
    display_remote,
    format_remote,
    parse_remote,
)
from airflow_upsert_provider.engine.common.retry import SPARK_CONNECT_CLIENT
from airflow_upsert_provider.engine.common.time_text import format_timestamp
from airflow_upsert_provider.engine.errors import ConfigurationError, SparkUnavailable, exception_chain
from airflow_upsert_provider.engine.spark.reads import PAGE_CHECKSUM_CONF

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DEFAULT_HOST = "127.0.0.1"
DEFAULT_STATE_DIR = "./.upsert"
SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
START_TIMEOUT_SECONDS = 120.0
STOP_TIMEOUT_SECONDS = 30.0
GIB = 1024 ** 3
MIB = 1024 ** 2
# Spark settings of the server; the engine's session settings that Spark fixes at start.
SERVER_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "8",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.sources.partitionOverwriteMode": "static",
    "spark.driver.host": DEFAULT_HOST,
    "spark.driver.bindAddress": DEFAULT_HOST,
    **PAGE_CHECKSUM_CONF,  # its sessions verify Parquet page checksums as in-process ones do
}

SERVER_LOG4J = """rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex
logger.connect.name = org.apache.spark.sql.connect.service.SparkConnectServer
logger.connect.level = info
# A failed config RPC (a client's spark.conf.set) is logged with Spark's message, which quotes
# the refused value: a value may be a secret. The client that sent it gets the error.
logger.rpcerrors.name = org.apache.spark.sql.connect.utils.ErrorUtils
logger.rpcerrors.level = warn
logger.rpcerrors.filter.config.type = RegexFilter
logger.rpcerrors.filter.config.regex = Spark Connect RPC error during: config[.].*
logger.rpcerrors.filter.config.onMatch = DENY
logger.rpcerrors.filter.config.onMismatch = NEUTRAL
"""


@dataclass(frozen=True)
class ServerState:
    pid: int
    host: str
    port: int
    log: str
    started_at: float
    driver_memory: str
    master: str

    @property
    def address(self) -> str:
        return f"sc://{self.host}:{self.port}"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "address": self.address}


# ----------------------------------------------------------------------------- pure decisions


def driver_memory(total_bytes: int) -> str:
    """Driver memory for a server on a machine with ``total_bytes`` of RAM: a third of it,
    at most 8 GiB (more only lengthens GC pauses for micro-batches), at least 1 GiB; whole
    MiB so that ``-Xmx`` takes it as is."""
    mib = min(8 * GIB, total_bytes // 3) // MIB
    return f"{max(1024, mib)}m"


def total_memory_bytes() -> int:
    """Physical memory of this machine; 4 GiB when the OS does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
        return 4 * GIB


def state_root(base: str | None = None, environ: Mapping[str, str] | None = None) -> str:
    """The engine's state directory: ``base``, else ``UPSERT_STATE_DIR``, else ``./.upsert``."""
    env = os.environ if environ is None else environ
    return os.path.abspath(base or env.get("UPSERT_STATE_DIR") or DEFAULT_STATE_DIR)


def state_dir(base: str | None = None) -> str:
    """Directory of the server's pid, port, log and lock files."""
    return os.path.join(state_root(base), "spark-server")


_PROPERTIES_ESCAPES = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\f": "\\f",
                      "=": "\\=", ":": "\\:", "#": "\\#", "!": "\\!"}


def properties_text(settings: Mapping[str, str]) -> str:
    """``settings`` as a Java properties file, what ``spark-submit --properties-file`` reads
    (as UTF-8): keys and values escaped so that each reads back exactly."""
    def escape(text: str, *, key: bool) -> str:
        out = "".join(_PROPERTIES_ESCAPES.get(char, char) for char in str(text))
        # A key ends at its first unescaped space; a value's leading spaces are dropped.
        return out.replace(" ", "\\ ") if key else ("\\" + out if out.startswith(" ") else out)

    return "".join(f"{escape(k, key=True)}={escape(v, key=False)}\n" for k, v in settings.items())


def write_private_properties(path: str, settings: Mapping[str, str]) -> None:
    """Write :func:`properties_text` of ``settings`` to ``path``, readable by its owner only
    from the first byte (a file that existed is replaced, not reused with its mode)."""
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(properties_text(settings))


def port_answers(host: str, port: int, timeout: float = 1.0) -> bool:
    """Whether something accepts TCP connections on (host, port)."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def require_reachable(url: str, timeout: float = 2.0) -> None:
    """Raise :class:`SparkUnavailable` naming ``url`` unless its port accepts connections.

    Spark's Connect client retries an unreachable server with backoff for minutes before it
    gives up; a task should instead fail at once with a retryable error."""
    host, port = parse_remote(url)
    if not port_answers(host, port, timeout=timeout):
        shown = display_remote(url)
        raise SparkUnavailable(
            f"no Spark Connect server answers at {shown}: start one (upsertctl spark-server start) "
            "or fix the address; nothing was changed",
            address=shown,
        )


# The Connect client's retries of a server that stopped answering (read at call time, so that a
# test can shorten them).
CLIENT_RETRIES = SPARK_CONNECT_CLIENT.retries
CLIENT_MAX_BACKOFF_MS = int(SPARK_CONNECT_CLIENT.max_wait_seconds * 1000)
# What the client says when the server is gone (refused, reset, timed out after its retries)
# or was restarted under the session (a new server does not know it).
_GONE_MARKERS = ("UNAVAILABLE", "Connection refused", "failed to connect", "RetriesExceeded",
                 "Socket closed", "INVALID_HANDLE.SESSION_NOT_FOUND", "INVALID_HANDLE.SESSION_CHANGED",
                 "SESSION_CLOSED")


def bound_client_retries(spark: "SparkSession") -> None:
    """Make the Connect session ``spark`` give up on a server that stopped answering after
    :data:`CLIENT_RETRIES` retries (about 47 s) instead of the client's ten minutes."""
    from pyspark.sql.connect.client.retries import DefaultPolicy

    spark.client.set_retry_policies(
        [DefaultPolicy(max_retries=CLIENT_RETRIES, max_backoff=CLIENT_MAX_BACKOFF_MS,
                       initial_backoff=int(SPARK_CONNECT_CLIENT.base_seconds * 1000),
                       backoff_multiplier=SPARK_CONNECT_CLIENT.multiplier)]
    )


def server_gone(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception in its chain) says the Connect server is unreachable,
    stopped, or restarted under the session: running the step again may succeed."""
    return any(any(marker in f"{type(current).__name__} {current}" for marker in _GONE_MARKERS)
               for current in exception_chain(exc))


# What the client says when the server failed inside its own handling of a request, as it
# does for every request of a session whose settings it cannot build (a server started with
# a value its sessions refuse).
_SERVER_FAILED_MARKER = "Application error processing RPC"


def server_failed_request(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception in its chain) says the Connect server failed while
    it handled the request, before it could even describe the failure."""
    return any(_SERVER_FAILED_MARKER in str(current) for current in exception_chain(exc))


def pid_alive(pid: int) -> bool:
    """Whether a process of that pid runs (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def is_server_process(pid: int) -> bool:
    """Whether ``pid`` is alive and a Spark Connect server (a reused pid is not)."""
    if pid <= 0 or not pid_alive(pid):
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            cmdline = handle.read()
    except FileNotFoundError:
        return False
    except OSError:  # no /proc (not Linux): trust the pid
        return True
    if cmdline == b"":  # a zombie: it exited, its parent has not reaped it
        return False
    return SERVER_CLASS.encode() in cmdline


# ------------------------------------------------------------------------------- state files


class SparkServer:
    """The local server whose files live in :func:`state_dir`."""

    def __init__(self, base_dir: str | None = None) -> None:
        self.dir = state_dir(base_dir)
        self.state_path = os.path.join(self.dir, "server.json")
        self.log_path = os.path.join(self.dir, "server.log")
        self.lock_path = os.path.join(self.dir, "lock")
        # The server's settings while it starts (0600); removed once it listens.
        self.properties_path = os.path.join(self.dir, "server.properties")

    # -- state file

    def read_state(self) -> ServerState | None:
        try:
            with open(self.state_path, encoding="utf-8") as handle:
                data = json.load(handle)
            return ServerState(**{k: data[k] for k in ServerState.__dataclass_fields__})
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError):
            return None  # a torn or foreign file: no server we know of

    def _write_state(self, state: ServerState) -> None:
        write_atomically(self.state_path, json.dumps(asdict(state)))

    def _clear_state(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.remove(self.state_path)

    @contextlib.contextmanager
    def _locked(self, timeout: float) -> Iterator[None]:
        """Hold the exclusive lock of the state directory; wait at most ``timeout`` seconds
        (a start in progress holds it while its server gets ready)."""
        os.makedirs(self.dir, exist_ok=True)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as exc:
                    if exc.errno not in (errno.EAGAIN, errno.EACCES):
                        raise
                    if time.monotonic() >= deadline:
                        raise SparkUnavailable(
                            f"another upsertctl holds {self.lock_path} for more than {timeout:.0f}s "
                            f"(a server start that hangs? see {self.log_path})",
                            lock=self.lock_path, log=self.log_path,
                        ) from None
                    time.sleep(0.1)
            yield
        finally:
            os.close(fd)  # releases the lock

    # -- status

    def status(self, *, query: bool = False, timeout: float = 2.0) -> dict[str, Any]:
        """What runs: ``running`` (the recorded pid is a live Connect server) and
        ``answering`` (its port accepts connections; with ``query``, a Connect client also
        ran ``spark.range(1).count()`` on it)."""
        state = self.read_state()
        if state is None:
            return {"running": False, "answering": False, "state_dir": self.dir, "log": self.log_path}
        running = is_server_process(state.pid)
        answering = running and port_answers(state.host, state.port, timeout=timeout)
        out = {**state.to_dict(), "running": running, "answering": answering, "state_dir": self.dir}
        if answering and query:
            out["query_seconds"] = _query_server(state.address)
        if not running:
            out["stale"] = True  # the recorded server is gone; start replaces the record
        return out

    # -- start

    def start(
        self,
        *,
        port: int = DEFAULT_PORT,
        host: str = DEFAULT_HOST,
        master: str = "local[*]",
        memory: str | None = None,
        conf: dict[str, str] | None = None,
        timeout: float = START_TIMEOUT_SECONDS,
    ) -> dict[str, Any]:
        """Start the server unless one runs; return its status with ``started`` (True when
        this call started it). Safe when several processes call it at once."""
        from airflow_upsert_provider.engine.spark.driver_memory import check_driver_memory

        check_port(port)
        if memory is not None:
            check_driver_memory(memory, option="--memory")
        if conf and "spark.driver.memory" in conf:
            check_driver_memory(conf["spark.driver.memory"])
        with self._locked(timeout + 30):
            state = self.read_state()
            if state is not None and is_server_process(state.pid):
                if port_answers(state.host, state.port):
                    out = {**self.status(), "started": False}
                    if state.port != port:
                        out["note"] = f"the server already runs on port {state.port}; stop it first to move it"
                    return out
                # Alive but deaf: starts wait for readiness under this lock, so this server
                # got stuck after it answered. Replace it.
                _terminate(state.pid, STOP_TIMEOUT_SECONDS, port=(state.host, state.port))
            self._clear_state()
            if port_answers(host, port):
                raise ConfigurationError(
                    f"port {port} on {host} is taken by another program: pass --port", field="port", port=port
                )
            state = self._launch(host=host, port=port, master=master, memory=memory, conf=conf or {})
            try:
                self._wait_ready(state, timeout)
            except BaseException:
                _terminate(state.pid, STOP_TIMEOUT_SECONDS)
                self._clear_state()
                raise
            finally:
                # spark-submit reads it before the server listens; a value kept on disk
                # would outlive its need.
                with contextlib.suppress(FileNotFoundError):
                    os.remove(self.properties_path)
            return {**self.status(), "started": True}

    def _launch(self, *, host: str, port: int, master: str, memory: str | None, conf: dict[str, str]) -> ServerState:
        spark_home = _spark_home()
        memory = memory or driver_memory(total_memory_bytes())
        settings = {
            **SERVER_CONF,
            "spark.master": master,
            "spark.driver.memory": memory,
            "spark.connect.grpc.binding.address": host,
            "spark.connect.grpc.binding.port": str(port),
            **conf,
        }
        if "spark.driver.extraJavaOptions" not in settings:
            # Warnings and errors only: a long-lived server's log would otherwise grow by
            # several INFO lines per query.
            log4j = os.path.join(self.dir, "log4j2.properties")
            with open(log4j, "w", encoding="utf-8") as handle:
                handle.write(SERVER_LOG4J)
            settings["spark.driver.extraJavaOptions"] = f"-Dlog4j.configurationFile=file:{log4j}"
        # Values go through a private properties file, never onto the command line (every
        # user's `ps` shows it) nor into server.log: a setting may carry a secret.
        properties = self.properties_path
        write_private_properties(properties, settings)
        command = [os.path.join(spark_home, "bin", "spark-submit"), "--class", SERVER_CLASS, "--name",
                   "upsert-spark-connect", "--properties-file", properties, "spark-internal"]
        env = dict(os.environ)
        env["SPARK_HOME"] = spark_home
        env["SPARK_LOCAL_IP"] = DEFAULT_HOST if host in ("127.0.0.1", "localhost") else env.get("SPARK_LOCAL_IP", "")
        if not env["SPARK_LOCAL_IP"]:
            del env["SPARK_LOCAL_IP"]
        # The server's Python workers (Python data sources, UDFs) run this interpreter, whose
        # environment has pyarrow and the engine.
        env["PYSPARK_PYTHON"] = sys.executable
        env.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        with open(self.log_path, "ab") as log:
            log.write(f"--- {format_timestamp(time.time())} starting: {' '.join(command)} "
                      f"(settings: {', '.join(sorted(settings))})\n".encode())
            log.flush()
            # A session of its own: the server outlives this process and a terminal's ^C.
            process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                       env=env, start_new_session=True, close_fds=True)
        state = ServerState(pid=process.pid, host=host, port=port, log=self.log_path, started_at=time.time(),
                            driver_memory=memory, master=master)
        self._write_state(state)
        self._process = process
        return state

    def _wait_ready(self, state: ServerState, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        process = getattr(self, "_process", None)
        while True:
            if port_answers(state.host, state.port, timeout=0.5) and is_server_process(state.pid):
                return
            code = process.poll() if process is not None else None
            if code is not None or not pid_alive(state.pid):
                raise SparkUnavailable(
                    f"the Spark Connect server exited (code {code}) before it listened on {state.address}; "
                    f"see {state.log}: {_startup_failure_cause_in(state.log)}",
                    address=state.address, log=state.log,
                )
            if time.monotonic() >= deadline:
                raise SparkUnavailable(
                    f"the Spark Connect server did not listen on {state.address} within {timeout:.0f}s; "
                    f"it was stopped; see {state.log}",
                    address=state.address, log=state.log,
                )
            time.sleep(0.2)

    # -- stop

    def stop(self, *, timeout: float = STOP_TIMEOUT_SECONDS) -> dict[str, Any]:
        """Terminate the recorded server (SIGTERM, SIGKILL after ``timeout``) and remove its
        record. Stopping a server that does not run only removes a stale record."""
        with self._locked(START_TIMEOUT_SECONDS + 30):
            state = self.read_state()
            if state is None:
                return {"stopped": False, "running": False, "state_dir": self.dir}
            was_running = is_server_process(state.pid)
            if was_running:
                _terminate(state.pid, timeout, port=(state.host, state.port))
            self._clear_state()
            return {"stopped": was_running, "running": False, "pid": state.pid, "address": state.address,
                    "state_dir": self.dir}


def _terminate(pid: int, timeout: float, *, port: tuple[str, int] | None = None) -> None:
    """SIGTERM the server's process group (the JVM and its Python workers), SIGKILL it after
    ``timeout``; reap it when it is our child. With ``port`` (host, port), return only once
    the server's port is closed: an exiting JVM frees its memory before its sockets, so its
    command line reads empty while the port still accepts, and a start right after the stop
    would find the port taken."""
    def signal_group(sig: int) -> None:
        try:
            os.killpg(pid, sig)  # the server leads its own session (start_new_session)
        except (ProcessLookupError, PermissionError):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def gone() -> bool:
        with contextlib.suppress(ChildProcessError):
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return True
        return not is_server_process(pid)

    def closed() -> bool:
        return port is None or not port_answers(*port, timeout=0.5)

    signal_group(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while not (gone() and closed()):
        if time.monotonic() >= deadline:
            signal_group(signal.SIGKILL)
            end = time.monotonic() + 10
            while not (gone() and closed()) and time.monotonic() < end:
                time.sleep(0.1)
            return
        time.sleep(0.1)


def _spark_home() -> str:
    import importlib.util

    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.origin:
        raise ConfigurationError("pyspark is not installed: it carries the Spark Connect server", field="pyspark")
    home = os.path.dirname(spec.origin)
    jars = os.path.join(home, "jars")
    if not any(name.startswith("spark-connect_") for name in os.listdir(jars) if name.endswith(".jar")):
        raise ConfigurationError(
            f"the installed pyspark at {home} has no spark-connect jar: install the full pyspark package",
            field="pyspark",
        )
    return home


# What the JVM itself says when it cannot start (before any exception exists): the line that
# names the cause, where the lines after it ("Error: Could not create the Java Virtual
# Machine.") only say that it failed.
_JVM_CAUSES = re.compile(r"(Unrecognized (VM )?option: |Invalid (maximum|initial|thread stack) \w+ size|"
                         r"Could not reserve enough space|There is insufficient memory|"
                         r"Error: Could not find or load main class)")
# The line that opens an exception's report: `Exception in thread "main" X: why`, a
# qualified `x.y.SomeException: why` (a log line's attached exception, a `Caused by:`), or a
# launcher's `Error: ...` / `Exception: ...`.
_EXCEPTION_LINE = re.compile(r'^(?:Exception in thread "[^"]*" |Caused by: )?'
                             r"((?:[\w$]+\.)*[\w$]*(?:Exception|Error)\b:?.*)$")
_STACK_FRAME = re.compile(r"^(at |\.\.\. \d+ more|Caused by: )")
START_MARK = re.compile(r"^--- \S+ starting: ")
CAUSE_MAX_CHARS = 400


def startup_failure_cause(log_text: str) -> str:
    """What stopped a server from starting, from its log ``log_text``: of the last start's
    lines (after its ``--- ... starting:`` mark), the first that names a known JVM start
    failure, else the first line that opens an exception (``Exception in thread "main"
    org.apache.spark.SparkException: Master must ...``: the exception, without the thread),
    else the last three lines that are not stack frames."""
    lines = [line.strip() for line in log_text.splitlines()]
    marks = [i for i, line in enumerate(lines) if START_MARK.match(line)]
    lines = [line for line in lines[marks[-1] + 1 if marks else 0:] if line]
    if not lines:
        return "(empty log)"
    found = next((line for line in lines if _JVM_CAUSES.search(line)), None)
    if found is None:
        found = next((match.group(1) for match in map(_EXCEPTION_LINE.match, lines) if match), None)
    if found is None:
        found = " | ".join([line for line in lines if not _STACK_FRAME.match(line)][-3:]) or "(stack frames only)"
    return found if len(found) <= CAUSE_MAX_CHARS else found[:CAUSE_MAX_CHARS - 3] + "..."


def _startup_failure_cause_in(path: str) -> str:
    """:func:`startup_failure_cause` of the log file's last 64 KiB."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 65536))
            return startup_failure_cause(handle.read().decode("utf-8", "replace"))
    except OSError:
        return "(no log)"


def _query_server(address: str) -> float:
    """Seconds a fresh Connect client takes to run ``spark.range(1).count()`` on the server."""
    from pyspark.sql import SparkSession

    started = time.monotonic()
    spark = SparkSession.builder.remote(address).create()
    try:
        if spark.range(1).count() != 1:  # pragma: no cover - Spark would be broken
            raise SparkUnavailable(f"the Spark Connect server at {address} answered wrongly", address=address)
    finally:
        with contextlib.suppress(Exception):
            spark.stop()
    return round(time.monotonic() - started, 3)
