"""The SparkSession the engine runs on, kept on loopback for local masters and quiet on stderr."""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from typing import TYPE_CHECKING, BinaryIO, Mapping

from airflow_upsert_provider.engine.common.atomic_file import write_atomically
from airflow_upsert_provider.engine.common.connect_address import (  # noqa: F401 (the session's names)
    SESSION_ID_PARAM,
    format_remote,
    named_session_id,
    parse_endpoint,
    with_session_id,
)
from airflow_upsert_provider.engine.errors import ConfigurationError, exception_chain, first_line
from airflow_upsert_provider.engine.spark.driver_memory import check_driver_memory
from airflow_upsert_provider.engine.spark.reads import PAGE_CHECKSUM_CONF

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DEFAULT_MASTER = "local[*]"
LOG4J_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "log4j2.properties")
# Sane defaults for micro-batches on a small machine; a connection or --conf overrides them.
DEFAULT_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "8",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.sources.partitionOverwriteMode": "static",
    "spark.driver.memory": "2g",
    **PAGE_CHECKSUM_CONF,
}
# Options of the driver JVM beyond the log4j configuration (see driver_java_options); a
# user's spark.driver.extraJavaOptions replaces them all. None by default: C1 only
# (-XX:TieredStopAtLevel=1) cuts a fresh one-batch task to about 0.8x but makes warm work
# 1.5-2.4x slower (continuous mode, compaction). The class-data-sharing archive's options
# are added when one is built (engine/spark/class_archive.py; docs/performance.md, "Cold
# in-process task").
DRIVER_JAVA_OPTIONS: tuple[str, ...] = ()
# Lines the driver JVM prints on stderr by itself, not through log4j, and that say nothing to
# a user: Spark's launcher always puts --add-modules=jdk.incubator.vector on the driver's
# command line, and the JVM then announces the incubator module; no JVM option turns that
# notice off. Only these exact lines are dropped; everything else the JVM writes passes.
JVM_NOTICES = frozenset({b"WARNING: Using incubator modules: jdk.incubator.vector"})


def refused_setting(key: str, value: str, exc: BaseException | str) -> ConfigurationError:
    """The :class:`ConfigurationError` for a Spark setting Spark refused: names the key and
    Spark's reason, never the value (it may be a secret)."""
    reason = first_line(exc) or type(exc).__name__
    value = str(value)
    if value:
        # Spark quotes the value; a long one is masked wherever it appears. (A short bare one
        # is left: masking "1" everywhere would garble the reason.)
        for shown in (f"'{value}'", f'"{value}"', *((value,) if len(value) >= 4 else ())):
            reason = reason.replace(shown, "<value>")
    return ConfigurationError(f"Spark refused the value of the setting {key} (--conf / spark_conf): {reason}",
                              field="spark_conf", key=key)


def _set_runtime_conf(runtime_conf, key: str, value: str) -> None:
    """``runtime_conf.set(key, value)``, a refused value a :class:`ConfigurationError`."""
    from pyspark.errors import IllegalArgumentException

    try:
        runtime_conf.set(key, value)
    except IllegalArgumentException as exc:
        raise refused_setting(key, value, exc) from exc


def _check_sql_values(conf: Mapping[str, str]) -> None:
    """Check each of ``conf``'s values against the setting Spark defines under its key, in
    the running driver JVM, before a session is built with them: a bad value (``abc`` for
    ``spark.sql.shuffle.partitions``) is a :class:`ConfigurationError` naming the key, where
    the session would fail to build its state without naming it."""
    from pyspark import SparkContext

    # Private: no public API reaches the driver JVM before a session is built.
    jvm = SparkContext._jvm
    if jvm is not None:
        _check_sql_values_in(jvm, conf)


def check_session_settings(conf: Mapping[str, str]) -> None:
    """Check ``conf`` as every session built on it checks it (a Spark Connect server's
    sessions all are), in a scratch driver JVM started for the check and stopped after it:
    a bad value is a :class:`ConfigurationError` naming the key, never the value. A server
    started with it would run and then refuse every session, and log the value each time."""
    if not conf:
        return
    # The scratch JVM's own settings only: launch_gateway puts them on its command line.
    settings = {"spark.driver.memory": "512m", "spark.driver.extraJavaOptions": driver_java_options()}
    gateway = _start_gateway(DEFAULT_MASTER, "upsert-settings-check", settings)
    try:
        _check_sql_values_in(gateway.jvm, conf)
    finally:
        gateway.shutdown()
        # It holds nothing: SIGTERM, not the seconds its exit on a closed stdin takes.
        gateway.proc.terminate()
        gateway.proc.wait()


def _check_sql_values_in(jvm, conf: Mapping[str, str]) -> None:
    from py4j.protocol import Py4JJavaError

    if not conf:
        return
    probe = jvm.org.apache.spark.sql.internal.SQLConf()
    for key, value in conf.items():
        try:
            probe.setConfString(key, str(value))
        except Py4JJavaError as exc:
            raise refused_setting(key, str(value), exc.java_exception.getMessage() or exc) from None


def driver_java_options() -> str:
    """The driver JVM's options of a new session: the engine's log4j configuration, then
    :data:`DRIVER_JAVA_OPTIONS`, then the class-data-sharing archive's options when a usable
    archive is built (decided from files, without starting a JVM; an invalid
    ``UPSERT_CLASS_ARCHIVE`` is a :class:`ConfigurationError`)."""
    from airflow_upsert_provider.engine.spark.class_archive import session_java_options

    return " ".join((f"-Dlog4j.configurationFile=file:{LOG4J_CONFIG}", *DRIVER_JAVA_OPTIONS,
                     *session_java_options()))


def is_local_master(master: str) -> bool:
    return master.startswith("local")


def resolve_remote(master: str | None, remote: str | None) -> str | None:
    """The Spark Connect address to use (``remote``, else ``UPSERT_SPARK_REMOTE``), or None
    for a classic session; a master given beside an address is refused (the server runs on
    its own master). Callers that may not start Spark at all check it up front with this."""
    remote = remote or os.environ.get("UPSERT_SPARK_REMOTE") or None
    if remote and master:
        raise ConfigurationError(
            f"a Spark master ({master!r}) and a Spark Connect address were both given: "
            "the Connect server runs on its own master; give one of them",
            field="master",
        )
    return remote


def get_spark(
    master: str | None = None,
    app_name: str = "airflow-upsert-provider",
    conf: Mapping[str, str] | None = None,
    remote: str | None = None,
    *,
    private: bool = False,
    environment: Mapping[str, str] | None = None,
) -> "SparkSession":
    """The active SparkSession, or a new one on ``master`` (default ``local[*]``).

    ``environment``: the whole environment of the driver JVM this call starts, and so of its
    executors' Python workers on a local master (default: this process's); how credentials
    of a connection reach them without entering this process's environment.

    ``remote`` (default ``UPSERT_SPARK_REMOTE``), an address ``sc://HOST:PORT``: a Spark
    Connect session on that server instead (see :func:`get_connect_spark`, and ``private``
    there); ``master`` is then refused, the server has its own.

    Local sessions bind the driver to 127.0.0.1: Spark otherwise picks a non-loopback
    address when the hostname resolves to loopback.

    When this process already has an active session, it is returned only if it can honour
    the request; a conflict is a :class:`ConfigurationError`, never silently ignored:

    - ``master``: a different master is refused, except between two local masters (they
      differ only in the number of threads, and one process holds one SparkContext);
    - ``conf``: a key whose value differs is set on the active session when Spark allows it
      at runtime (SQL settings such as ``spark.sql.shuffle.partitions``); a static one
      (``spark.driver.memory``, ``spark.executor.*``...) is refused, naming the keys.

    A new local session starts its driver JVM with stderr through a filter that drops only
    :data:`JVM_NOTICES`, so that a CLI run prints nothing but its own lines and real errors.
    """
    from pyspark.sql import SparkSession

    remote = resolve_remote(master, remote)
    if remote:
        return get_connect_spark(remote, conf=conf, private=private)
    active = SparkSession.getActiveSession()
    if active is not None and is_connect_session(active):
        raise ConfigurationError(
            "a Spark Connect session is active in this process; an in-process session cannot start "
            "beside it: pass the same --remote, or run in a new process",
            field="master",
        )
    if active is not None:
        _check_active(active, master, conf or {})
        return active
    master = master or os.environ.get("UPSERT_SPARK_MASTER", DEFAULT_MASTER)
    settings = dict(DEFAULT_CONF)
    if is_local_master(master):
        # Python workers (the Kafka data source, Arrow mapping) run this interpreter, whose
        # environment has pyarrow and the engine; Spark would otherwise start `python3` from
        # PATH, which outside an activated venv has neither.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if is_local_master(master) or os.environ.get("SPARK_LOCAL_IP") == "127.0.0.1":
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        settings["spark.driver.host"] = "127.0.0.1"
        settings["spark.driver.bindAddress"] = "127.0.0.1"
    if "spark.driver.extraJavaOptions" not in (conf or {}):
        # Only takes effect when this call launches the driver JVM (the usual case).
        settings["spark.driver.extraJavaOptions"] = driver_java_options()
    settings.update(conf or {})
    check_driver_memory(settings["spark.driver.memory"])
    _launch_driver_jvm(master, app_name, settings, environment)
    _check_sql_values(conf or {})
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(os.environ.get("UPSERT_SPARK_LOG_LEVEL", "ERROR"))
    _replace_pyspark_interrupt_handler(spark)
    return spark


def _replace_pyspark_interrupt_handler(spark: "SparkSession") -> None:
    """Answer Ctrl-C with a ``KeyboardInterrupt`` and no report on stderr.

    A new SparkContext makes SIGINT cancel every job through Py4J from the signal handler,
    on the main thread, which is then mostly inside a Py4J call waiting for a job: the
    reentrant call fails and Py4J logs that failure, then the ``KeyboardInterrupt``, each
    with its traceback (about 50 lines). Here the jobs are cancelled from a thread of their
    own (a Py4J connection of its own), and Py4J's report of the interrupt it re-raises is
    dropped (:class:`Py4JInterruptReports`)."""
    import logging
    import signal

    if threading.current_thread() is not threading.main_thread():
        return
    if not getattr(signal.getsignal(signal.SIGINT), "__module__", "").startswith("pyspark."):
        return  # not PySpark's: someone else's choice, kept
    context = spark.sparkContext

    def cancel_jobs() -> None:
        try:
            context.cancelAllJobs()
        except Exception:  # noqa: BLE001 - the process is going down; the JVM with it
            pass

    def interrupt(signum: int, frame: object) -> None:
        threading.Thread(target=cancel_jobs, name="spark-cancel-jobs", daemon=True).start()
        raise KeyboardInterrupt()

    signal.signal(signal.SIGINT, interrupt)
    # Py4J reports on the root logger (java_gateway's ``logging.exception``) and on its own
    # loggers; a logger's filter sees only the records logged on that logger itself.
    for name in ("", "py4j.java_gateway", "py4j.clientserver"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, Py4JInterruptReports) for f in logger.filters):
            logger.addFilter(Py4JInterruptReports())


class Py4JInterruptReports:
    """A logging filter that drops Py4J's reports of a ``KeyboardInterrupt`` and of what
    failed while it unwound (closing the interrupted connection): Py4J re-raises the
    interrupt, and the caller's handling of it is the one report a user should see."""

    @staticmethod
    def filter(record: object) -> bool:
        exc_info = getattr(record, "exc_info", None)
        if not exc_info or f"{os.sep}py4j{os.sep}" not in str(getattr(record, "pathname", "")):
            return True
        return not any(isinstance(current, KeyboardInterrupt) for current in exception_chain(exc_info[1]))


def is_connect_session(spark: "SparkSession") -> bool:
    """Whether ``spark`` is a Spark Connect client session (it has no SparkContext)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


# What the engine sets on a new session that Spark fixes when a session starts: a Connect
# server has them already (engine/spark/server.py), a client cannot change them.
_SERVER_ONLY_PREFIXES = ("spark.ui.", "spark.driver.", "spark.executor.", "spark.master")


# Fresh task processes with the engine's default settings share one server session per
# half hour: a batch in a new Connect session pays about 0.5 s more on the server than one in
# a session that ran a batch before (docs/performance.md, "Spark Connect: one task's whole
# process"). A session id is the key to a server session: whoever knows it runs in the
# session and reaches what is registered there. The shared id is random, recorded in a file
# readable by its owner only under the state directory, where the sharing processes find it,
# and replaced by a new random one when it is older than the window, so that a session the
# server closed after its idle timeout (60 min by default), whose id it then refuses for good,
# is not asked for either.
SHARED_SESSION_WINDOW_SECONDS = 1800
SHARED_SESSION_SUBDIR = "spark-connect"
# Ids of the server sessions this process opened as shared ones (see is_shared_session).
_SHARED_SESSION_IDS: set[str] = set()


def new_session_id() -> str:
    """A random session id (Spark's client accepts only a UUID of version 4)."""
    import uuid

    return str(uuid.uuid4())


def shared_session_decision(record: Mapping[str, object] | None, now: float, fresh_id: str,
                            window_seconds: int = SHARED_SESSION_WINDOW_SECONDS,
                            closed_id: str | None = None) -> dict[str, object]:
    """The shared session record to use at ``now``: ``record`` while it is well-formed,
    younger than ``window_seconds`` and not the session the server closed (``closed_id``);
    else a new one naming ``fresh_id``."""
    if isinstance(record, Mapping):
        session_id, created_at = record.get("session_id"), record.get("created_at")
        if (isinstance(session_id, str) and _is_uuid4(session_id) and isinstance(created_at, (int, float))
                and 0 <= now - created_at < window_seconds and session_id != closed_id):
            return dict(record)
    return {"session_id": fresh_id, "created_at": now}


def _is_uuid4(text: str) -> bool:
    import uuid

    try:
        return uuid.UUID(text).version == 4 and str(uuid.UUID(text)) == text
    except ValueError:
        return False


def shared_session_path(host: str, port: int, base: str | None = None) -> str:
    """The record of the shared session on the server at (host, port)."""
    from airflow_upsert_provider.engine.spark.server import state_root

    safe_host = re.sub(r"[^A-Za-z0-9.-]", "_", host)
    return os.path.join(state_root(base), SHARED_SESSION_SUBDIR, f"shared-session-{safe_host}-{port}.json")


def shared_session_id(host: str, port: int, now: float, *, base: str | None = None,
                      closed_id: str | None = None) -> str | None:
    """The id of the server session that tasks with the engine's default settings share on
    (host, port) at ``now`` (:func:`shared_session_decision` on the recorded one, under an
    exclusive lock, a new record written owner-only). None when the state directory cannot
    hold the record: the caller then runs in a session of its own."""
    import fcntl
    import json

    path = shared_session_path(host, port, base)
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        lock = os.open(path + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        return None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            with open(path, encoding="utf-8") as handle:
                record = json.load(handle)
        except (OSError, ValueError):
            record = None
        decided = shared_session_decision(record, now, new_session_id(), closed_id=closed_id)
        if decided != record:
            write_atomically(path, json.dumps(decided), durable=False, mode=0o600)
        return str(decided["session_id"])
    except OSError:
        return None
    finally:
        os.close(lock)


def is_shared_session(spark: "SparkSession") -> bool:
    """Whether ``spark`` runs in a server session that this process opened as the shared one
    (other tasks run in it too): nothing secret may be registered in it."""
    # A classic session has no server session id (its ``client`` raises, not None).
    return is_connect_session(spark) and spark.session_id in _SHARED_SESSION_IDS


def get_connect_spark(remote: str, conf: Mapping[str, str] | None = None, *, private: bool = False) -> "SparkSession":
    """A Spark Connect session on the server at ``remote`` (``sc://HOST:PORT``).

    The port is probed first: a server that is down is a retryable :class:`SparkUnavailable`
    naming the address at once (Spark's client would retry for minutes). The engine's
    runtime settings (:data:`DEFAULT_CONF` SQL keys, then ``conf``) are set on the session; a
    key of ``conf`` that only the server fixes and whose value there differs is a
    :class:`ConfigurationError` naming the keys, never silently ignored. An active Connect
    session on the same address is reused; one on another address is refused.

    Without ``conf``, ``private`` and a ``session_id`` in ``remote``, the server session is the
    shared one of :func:`shared_session_id`; with ``conf`` or ``private`` (the task will
    register something secret, such as a Kafka client config) it is a new one of its own,
    released when it stops (a setting or a secret must not reach another task). A named
    session, shared or the address's own, is never released when the session stops: the next
    task uses it. A shared session the server has closed is replaced by a new random one."""
    from pyspark.sql import SparkSession

    from airflow_upsert_provider.engine.spark.server import (
        display_remote,
        parse_remote,
        require_reachable,
        server_failed_request,
        server_gone,
    )

    host, port = parse_remote(remote)
    shown = display_remote(remote)  # without parameters: a token is a secret
    active = SparkSession.getActiveSession()
    if active is not None:
        if not is_connect_session(active):
            raise ConfigurationError(
                "an in-process SparkSession is active in this process; a Spark Connect session on "
                f"{shown} cannot replace it: stop it first or run in a new process",
                field="remote",
            )
        if _connect_address(active) != (host, port):
            require_reachable(remote)  # a server that is down says so first: a retry may help
            raise ConfigurationError(
                f"a Spark Connect session on another server is active in this process; it cannot "
                f"run on {shown}: stop it first or run in a new process",
                field="remote",
            )
        if private and is_shared_session(active):
            raise ConfigurationError(
                f"the Spark Connect session active in this process on {shown} is shared with other tasks; "
                "a task that registers a secret (a Kafka client config) needs a session of its own: "
                "stop it first or run in a new process",
                field="remote",
            )
        _apply_connect_conf(active, shown, conf or {}, defaults=False)
        return active
    require_reachable(remote)
    named = named_session_id(remote) is not None
    try:
        shared_id = None if conf or named or private else shared_session_id(host, port, time.time())
        if shared_id is None:
            return _open_connect(remote, shown, conf or {}, named=named)
        try:
            return _open_shared(remote, shown, shared_id)
        except Exception as exc:
            if "SESSION_CLOSED" not in str(exc):
                raise
            # Released by another client, or expired under a shorter idle timeout: the
            # server refuses that id for good. A new random one replaces it for every task.
            replaced = shared_session_id(host, port, time.time(), closed_id=shared_id)
            if replaced is None or replaced == shared_id:
                return _open_connect(remote, shown, {}, named=False)
            return _open_shared(remote, shown, replaced)
    except Exception as exc:  # a server that stopped between the probe and the session
        if server_gone(exc):
            from airflow_upsert_provider.engine.errors import SparkUnavailable

            raise SparkUnavailable(
                f"the Spark Connect server at {shown} did not answer: {first_line(exc)}",
                address=shown,
            ) from None
        if server_failed_request(exc):
            # The server cannot open a session; its log names the setting (and its value).
            raise ConfigurationError(
                f"the Spark Connect server at {shown} failed to open a session ('Application error "
                "processing RPC'): a setting it was started with is likely invalid (its server.log names "
                "it); restart it with valid settings (upsertctl spark-server stop, then start)",
                field="spark_conf", address=shown,
            ) from None
        raise


def _open_shared(remote: str, shown: str, session_id: str) -> "SparkSession":
    spark = _open_connect(with_session_id(remote, session_id), shown, {}, named=True)
    _SHARED_SESSION_IDS.add(session_id)
    return spark


def _open_connect(url: str, shown: str, conf: Mapping[str, str], *, named: bool) -> "SparkSession":
    from pyspark.sql import SparkSession

    from airflow_upsert_provider.engine.spark.server import bound_client_retries

    spark = SparkSession.builder.remote(url).getOrCreate()
    # stop() releases the server session, after which the server refuses its id for good.
    spark.release_session_on_close = not named
    try:
        bound_client_retries(spark)
        _apply_connect_conf(spark, shown, conf, defaults=True)
    except Exception:
        spark.release_session_on_close = False
        spark.stop()  # this client only: the default session of the process is free again
        raise
    return spark


def connect_address(spark: "SparkSession") -> str:
    """``sc://HOST:PORT`` of the server a Connect session talks to (never a token)."""
    return format_remote(*_connect_address(spark))


def _connect_address(spark: "SparkSession") -> tuple[str, int]:
    # Private: no public API gives the port (``spark.client.host`` gives the host only).
    endpoint = getattr(getattr(spark.client, "_builder", None), "endpoint", "")
    host, port = parse_endpoint(str(endpoint))
    return (host, int(port)) if port.isdigit() else ("", 0)


def _apply_connect_conf(spark: "SparkSession", remote: str, conf: Mapping[str, str], *, defaults: bool) -> None:
    settings = {k: v for k, v in DEFAULT_CONF.items() if not k.startswith(_SERVER_ONLY_PREFIXES)} if defaults else {}
    settings.update(conf)
    fixed = []
    for key, value in settings.items():
        if spark.conf.get(key, None) == str(value):
            continue
        if spark.conf.isModifiable(key):
            _set_runtime_conf(spark.conf, key, str(value))
        elif key in conf:
            fixed.append(key)
    if fixed:
        # Names only: a value may be a secret (a storage key, a password).
        raise ConfigurationError(
            f"the Spark Connect server at {remote} has other values for {', '.join(sorted(fixed))}, which "
            "Spark fixes when the server starts: set them on the server (upsertctl spark-server start "
            "--conf) or drop them",
            field="spark_conf",
        )


def _check_active(active: "SparkSession", master: str | None, conf: Mapping[str, str]) -> None:
    current_master = active.sparkContext.master
    if master and master != current_master and not (is_local_master(master) and is_local_master(current_master)):
        raise ConfigurationError(
            f"a SparkSession on master {current_master!r} is already active in this process; it "
            f"cannot run on {master!r}: stop it first or run in a new process",
            field="master",
        )
    static = []
    for key, value in conf.items():
        if active.conf.get(key, None) == str(value):
            continue
        if active.conf.isModifiable(key):
            _set_runtime_conf(active.conf, key, str(value))
        else:
            static.append(key)
    if static:
        # Names only: a value may be a secret (a storage key, a password).
        raise ConfigurationError(
            f"the SparkSession already active in this process has other values for "
            f"{', '.join(sorted(static))}, which Spark fixes when a session starts: stop it "
            "first or run in a new process",
            field="spark_conf",
        )


def _launch_driver_jvm(master: str, app_name: str, settings: Mapping[str, str],
                       environment: Mapping[str, str] | None = None) -> None:
    """Start the driver JVM (the Py4J gateway) as pyspark would, with its stdout and stderr
    both through :func:`_forward_stderr` to this process's stderr. Nothing to do when this
    process has a gateway already, or when ``spark-submit`` started this process next to its
    JVM.

    The JVM holds none of this process's own output streams: stdout carries only the
    process's own output (``upsertctl --json``), and a caller that reads this process's output
    to its end (Airflow's task runner, a shell pipe) is done when this process exits, not
    after the JVM's shutdown (stopping the SparkContext, deleting its temporary
    directories: about 0.45 s), which runs on after it."""
    from pyspark import SparkContext

    # Private: no public API says whether this process has a gateway (a stopped session keeps it).
    if SparkContext._gateway is not None or "PYSPARK_GATEWAY_PORT" in os.environ:
        return
    gateway = _start_gateway(master, app_name, settings, environment)
    # Private: no public API adopts a gateway without creating a SparkContext on it.
    SparkContext._ensure_initialized(gateway=gateway)


def _start_gateway(master: str, app_name: str, settings: Mapping[str, str],
                   environment: Mapping[str, str] | None = None):
    """A new driver JVM (the Py4J gateway) on ``settings``, its stdout and stderr through
    :func:`_forward_stderr` to this process's stderr; ``environment``: its whole environment
    (None: this process's)."""
    from pyspark import SparkConf
    from pyspark.java_gateway import launch_gateway

    conf = SparkConf(loadDefaults=False).setMaster(master).setAppName(app_name)
    for key, value in settings.items():
        conf.set(key, value)
    # The reader runs before the JVM starts: a JVM that fails at startup is still heard.
    read_end, write_end = os.pipe()
    reader = os.fdopen(read_end, "rb", buffering=0)
    threading.Thread(target=_forward_stderr, args=(reader,), name="spark-driver-stderr", daemon=True).start()
    try:
        popen_kwargs = {"stdout": write_end, "stderr": write_end} if environment is None else _EnvironmentOf(
            environment, stdout=write_end, stderr=write_end)
        return launch_gateway(conf, popen_kwargs=popen_kwargs)
    finally:
        os.close(write_end)  # the JVM holds its own copy; EOF comes when it exits


class _EnvironmentOf(dict):
    """Keyword arguments of the driver JVM's ``Popen`` whose ``env`` is ``environment`` plus
    what PySpark's ``launch_gateway`` adds to this process's environment for its gateway:
    ``launch_gateway`` always sets ``env`` itself, from ``os.environ``."""

    def __init__(self, environment: Mapping[str, str], **kwargs) -> None:
        super().__init__(**kwargs)
        self._environment = dict(environment)

    def __setitem__(self, key, value) -> None:
        if key == "env":
            added = {name: text for name, text in value.items() if os.environ.get(name) != text}
            value = {**self._environment, **added}
        super().__setitem__(key, value)


def _forward_stderr(stream: BinaryIO) -> None:
    """Copy the JVM's output to this process's stderr line by line, without the notices."""
    with stream:
        for line in iter(stream.readline, b""):
            if line.rstrip(b"\r\n") in JVM_NOTICES:
                continue
            pending = memoryview(line)
            try:
                while pending:
                    pending = pending[os.write(2, pending):]
            except OSError:  # our stderr is gone: nothing left to tell
                return
