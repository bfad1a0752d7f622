"""A class-data-sharing (CDS) archive of the driver JVM, so that a fresh task maps the classes
a batch loads instead of loading and verifying them from the jars (docs/performance.md,
"Cold in-process task").

The archive is keyed by the pyspark version and the Java version
(``spark-<pyspark>-java-<java.version>.jsa`` under ``<state dir>/class-archive/``, the state
dir being ``UPSERT_STATE_DIR`` or ``./.upsert``); ``UPSERT_CLASS_ARCHIVE`` names another file,
or ``off`` disables it. Next to it a JSON sidecar (``<archive>.json``) records what it was
built with: the java binary (resolved as Spark does: ``JAVA_HOME/bin/java``, else ``java`` on
PATH), that binary's mtime and size, the pyspark version and installation, the archive's size
and mtime, and its SHA-256. A new session uses the archive only when the sidecar matches all of
them: a few ``stat`` calls, then the checksum of the archive (no JVM starts to decide). A JVM
would ignore a stale archive anyway (-Xshare:auto), but a missing or unusable
``SharedArchiveFile`` also turns off the JDK's own default archive, so the option is given only
when it can work; and a JVM maps an archive damaged in place (same size and mtime) and crashes
on it (SIGSEGV), which only the checksum sees. A damaged archive is left out with a warning
naming it; ``upsertctl spark-archive status`` reports it as damaged.

Building (:func:`build_archive`) runs a small representative batch in a child process whose
driver JVM writes the archive at exit (``-XX:ArchiveClassesAtExit``) to a temporary name in
the same directory; only after that JVM exited cleanly is it renamed into place, then the
sidecar. Builds hold an ``fcntl`` lock on ``<archive>.lock``. The child, its JVM and the JVM's
Python workers form a process group that dies with the building process (a killed build
would otherwise leave them to finish a dump of 165 MB that nobody renames), and every build,
status and remove deletes the temporary files and directories of builds whose process is gone.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Iterator, Mapping

from airflow_upsert_provider.engine.common.atomic_file import write_atomically
from airflow_upsert_provider.engine.errors import ConfigurationError
from airflow_upsert_provider.engine.spark.server import pid_alive, state_root

log = logging.getLogger(__name__)

OVERRIDE_ENV = "UPSERT_CLASS_ARCHIVE"
ARCHIVE_SUBDIR = "class-archive"
# The JVM prints hundreds of [warning][cds] lines (classes it cannot archive) on stdout while
# dumping, and would print any CDS warning there when mapping: stdout is a --json output.
QUIET_CDS_LOGGING = "-Xlog:cds*=off"
# Values that look like a switch rather than a path: refused, so a typo of "off" never
# becomes a file name.
_SWITCH_WORDS = frozenset({"on", "true", "false", "yes", "no", "1", "0", "none", "disable", "disabled", "enabled"})


def archive_setting(environ: Mapping[str, str] | None = None) -> str | None:
    """``UPSERT_CLASS_ARCHIVE``: ``"off"``, an absolute file path, or None (the default
    location). Anything else is a :class:`ConfigurationError` naming the variable."""
    raw = (os.environ if environ is None else environ).get(OVERRIDE_ENV)
    if raw is None:
        return None
    value = raw.strip()
    if value.lower() == "off":
        return "off"
    if not value or value.lower() in _SWITCH_WORDS or value.endswith(("/", os.sep)) or os.path.isdir(value):
        raise ConfigurationError(
            f"{OVERRIDE_ENV}={raw!r} is neither 'off' nor the path of an archive file "
            "(unset it for the default under the state directory)",
            field=OVERRIDE_ENV,
        )
    return os.path.abspath(os.path.expanduser(value))


def archive_name(pyspark_version: str, java_version: str) -> str:
    """The archive's file name for these versions."""
    safe = [re.sub(r"[^A-Za-z0-9._+-]", "_", v) for v in (pyspark_version, java_version)]
    return f"spark-{safe[0]}-java-{safe[1]}.jsa"


def sidecar_path(archive: str) -> str:
    return archive + ".json"


def resolve_java(environ: Mapping[str, str] | None = None) -> str | None:
    """The java binary Spark's launcher runs (``JAVA_HOME/bin/java``, else ``java`` on PATH),
    symlinks resolved; None if there is none."""
    env = os.environ if environ is None else environ
    home = env.get("JAVA_HOME")
    found = os.path.join(home, "bin", "java") if home else shutil.which("java", path=env.get("PATH"))
    return os.path.realpath(found) if found and os.path.isfile(found) else None


def runtime_identity(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """What an archive must have been built with to be used here: the java binary (path,
    mtime, size) and the pyspark version and installation. Costs a few ``stat`` calls."""
    import pyspark

    identity: dict[str, Any] = {"pyspark": pyspark.__version__,
                                "spark_home": os.path.dirname(os.path.abspath(pyspark.__file__))}
    java = resolve_java(environ)
    if java is not None:
        info = os.stat(java)
        identity.update(java=java, java_mtime_ns=info.st_mtime_ns, java_size=info.st_size)
    return identity


_IDENTITY_KEYS = ("java", "java_mtime_ns", "java_size", "pyspark", "spark_home")


# The reason of an archive whose bytes are not those it was built with.
DAMAGED = "damaged"


def file_sha256(path: str) -> str:
    """Hex SHA-256 of a file's content."""
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def archive_usable(archive: str, sidecar: Mapping[str, Any] | None, current: Mapping[str, Any],
                   checksum: Callable[[str], str] = file_sha256, *, full_check: bool = False) -> tuple[bool, str]:
    """Whether ``archive`` may be given to a new driver JVM, and why not: the file exists and
    is not empty, its size and mtime are those its sidecar recorded (not a half-written or
    replaced file), the sidecar's java binary and pyspark are ``current``'s, and last its
    ``checksum`` is the sidecar's ``archive_sha256`` (not a file damaged in place; a reason
    starting with :data:`DAMAGED`).

    The checksum reads the whole file (0.3-0.5 s for 165 MB, a tenth of what the archive
    saves a cold task), so a session skips it while the file's inode and change time are the
    ones recorded when it was hashed: any write, ``touch`` or ``chmod`` sets the change time,
    and no user call can set it back. ``full_check`` (``spark-archive status``) always reads."""
    try:
        info = os.stat(archive)
    except OSError:
        return False, "no archive"
    if info.st_size == 0:
        return False, "the archive is empty"
    if not sidecar:
        return False, f"no readable sidecar {sidecar_path(archive)}"
    if (sidecar.get("archive_size"), sidecar.get("archive_mtime_ns")) != (info.st_size, info.st_mtime_ns):
        return False, "the archive is not the file its sidecar describes"
    if "java" not in current:
        return False, "no java binary found (JAVA_HOME, PATH)"
    stale = [key for key in _IDENTITY_KEYS if sidecar.get(key) != current.get(key)]
    if stale:
        return False, f"built for another {', '.join(stale)}: rebuild it (upsertctl spark-archive build)"
    expected = sidecar.get("archive_sha256")
    if not isinstance(expected, str):
        return False, "its sidecar records no checksum: rebuild it (upsertctl spark-archive build)"
    hashed_as = (sidecar.get("archive_ino"), sidecar.get("archive_ctime_ns"))
    if not full_check and hashed_as == (info.st_ino, info.st_ctime_ns):
        return True, "usable"
    try:
        actual = checksum(archive)
    except OSError as exc:
        return False, f"{DAMAGED}: it cannot be read ({exc.strerror or exc}): rebuild it (upsertctl spark-archive build)"
    if actual != expected:
        return False, (f"{DAMAGED}: its content is not what was built (SHA-256 differs): rebuild it "
                       "(upsertctl spark-archive build) or remove it (upsertctl spark-archive remove)")
    return True, "usable"


def read_sidecar(archive: str) -> dict[str, Any] | None:
    try:
        with open(sidecar_path(archive), encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def locate(base: str | None = None, environ: Mapping[str, str] | None = None,
           current: Mapping[str, Any] | None = None, *, full_check: bool = False) -> dict[str, Any]:
    """The archive a new session would use: ``{"path", "usable", "reason", "sidecar"}``
    (``path`` None when disabled or when no archive of this pyspark version is built). At
    the default location the Java version is not known without a JVM: every archive of this
    pyspark version is considered and the one whose sidecar matches the java binary wins."""
    setting = archive_setting(environ)
    if setting == "off":
        return {"path": None, "usable": False, "reason": f"disabled ({OVERRIDE_ENV}=off)", "sidecar": None}
    current = runtime_identity(environ) if current is None else current
    if setting is not None:
        candidates = [setting]
    else:
        directory = os.path.join(state_root(base, environ), ARCHIVE_SUBDIR)
        prefix = archive_name(str(current["pyspark"]), "").removesuffix(".jsa")
        try:
            names = sorted(n for n in os.listdir(directory) if n.startswith(prefix) and n.endswith(".jsa"))
        except OSError:
            names = []
        candidates = [os.path.join(directory, n) for n in names]
    found: dict[str, Any] = {"path": None, "usable": False, "reason": "no archive built", "sidecar": None}
    for path in candidates:
        sidecar = read_sidecar(path)
        usable, reason = archive_usable(path, sidecar, current, full_check=full_check)
        if usable or found["path"] is None:
            found = {"path": path, "usable": usable, "reason": reason, "sidecar": sidecar}
        if usable:
            break
    return found


def session_java_options(base: str | None = None, environ: Mapping[str, str] | None = None,
                         current: Mapping[str, Any] | None = None) -> tuple[str, ...]:
    """The driver JVM options for the archive: ``-XX:SharedArchiveFile=P`` and the quiet
    CDS logging when an archive is usable, nothing otherwise."""
    found = locate(base, environ, current)
    if not found["usable"]:
        if found["reason"].startswith(DAMAGED):
            # The session runs without it (slower to start, correct); a JVM that mapped it
            # would crash.
            log.warning("the class archive %s is not used: %s", found["path"], found["reason"])
        return ()
    return (f"-XX:SharedArchiveFile={found['path']}", QUIET_CDS_LOGGING)


# -- building

# Runs first in the dumping child, which leads a process group of its own (its JVM and the
# JVM's Python workers are in it): when the building process dies, even by SIGKILL, the kernel
# sends the child SIGTERM (PR_SET_PDEATHSIG), and the child kills the whole group with
# SIGKILL. A JVM that merely exited (stdin closed) would first write its dump.
_DIE_WITH_PARENT = """
import ctypes, os, signal
signal.signal(signal.SIGTERM, lambda *_: os.killpg(0, signal.SIGKILL))
ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
if os.getppid() != int(os.environ["UPSERT_ARCHIVE_BUILDER_PID"]):  # it died before prctl
    os.killpg(0, signal.SIGKILL)
"""

# The child that dumps: the engine's driver JVM options plus ArchiveClassesAtExit, then
# upsertctl's commands in one process (one JVM), then a clean JVM exit, waited for: the
# archive is complete only once the JVM has exited.
_DUMP_CHILD = """
import json, sys
from airflow_upsert_provider.engine.spark import session as spark
target, commands = sys.argv[1], json.loads(sys.argv[2])
spark.DRIVER_JAVA_OPTIONS = (*spark.DRIVER_JAVA_OPTIONS, "-XX:ArchiveClassesAtExit=" + target, "%s")
from airflow_upsert_provider.cli import main
for argv in commands:
    code = main(argv)
    if code:
        sys.exit(code)
from pyspark import SparkContext
from pyspark.sql import SparkSession
SparkSession.getActiveSession().stop()
# Private: no public API gives the driver JVM's process, whose exit completes the archive.
proc = SparkContext._gateway.proc
proc.stdin.close()
sys.exit(proc.wait(timeout=600))
""" % QUIET_CDS_LOGGING


def java_version(java: str) -> str:
    """``java.version`` of a java binary (starts a JVM: used only when building)."""
    done = subprocess.run([java, "-XshowSettings:properties", "-version"], capture_output=True, text=True, timeout=120)
    match = re.search(r"^\s*java\.version = (\S+)", done.stderr, re.MULTILINE)
    if not match:
        raise ConfigurationError(f"could not read the Java version of {java}: {done.stderr[-300:]}", field="java")
    return match.group(1)


@contextlib.contextmanager
def _locked(path: str) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # a build in progress takes about half a minute
        yield
    finally:
        os.close(fd)


def _write_json_atomically(path: str, data: Mapping[str, Any]) -> None:
    write_atomically(path, json.dumps(data, indent=1, sort_keys=True))


def target_path(version: str, base: str | None = None, environ: Mapping[str, str] | None = None) -> str:
    """Where :func:`build_archive` writes for Java ``version``: the file
    ``UPSERT_CLASS_ARCHIVE`` names, else the keyed name under the state directory."""
    setting = archive_setting(environ)
    if setting not in (None, "off"):
        return setting
    import pyspark

    return os.path.join(state_root(base, environ), ARCHIVE_SUBDIR, archive_name(pyspark.__version__, version))


def build_archive(base: str | None = None, *, force: bool = False,
                  progress: Callable[[str], None] = lambda line: None,
                  rows: int = 20_000) -> dict[str, Any]:
    """Build the archive unless a usable one exists (``force`` rebuilds). Returns
    :func:`archive_status`'s fields plus ``built`` and ``seconds``."""
    from airflow_upsert_provider.sample_data import SAMPLE_SCHEMA_DDL, SampleSpec, generate

    if archive_setting() == "off":
        raise ConfigurationError(f"{OVERRIDE_ENV}=off: the class archive is disabled, nothing to build",
                                 field=OVERRIDE_ENV)
    java = resolve_java()
    if java is None:
        raise ConfigurationError("no java binary found (JAVA_HOME, PATH)", field="java")
    version = java_version(java)  # starts a JVM: once per build
    target = target_path(version, base)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    remove_leftovers(os.path.dirname(target))
    started = time.monotonic()
    with _locked(target + ".lock"):
        # A build that waited for another one finds its archive and reports it.
        if not force and archive_usable(target, read_sidecar(target), runtime_identity())[0]:
            progress(f"a usable archive exists: {target}")
            return {**archive_status(base), "built": False, "seconds": round(time.monotonic() - started, 2)}
        tmp = f"{target}.tmp-{os.getpid()}"
        work = tempfile.mkdtemp(prefix=f"{WORK_DIR_PREFIX}{os.getpid()}-", dir=os.path.dirname(target))
        try:
            landing = os.path.join(work, "landing")
            # Two batches: one into an empty shard, one merged into the rows it wrote.
            generate(landing, SampleSpec(records=rows, keys=rows // 2, partitions=2, segments_per_partition=2, seed=7))
            shard = "class-archive"
            common = ["--consensus", f"sqlite:///{work}/consensus.db", "--blob-root", os.path.join(work, "blob"),
                      "--master", "local[*]"]
            commands = [
                ["init", shard, "--source", f"dir:{landing}", "--key", "id", "--order-by", "updated_at",
                 "--delete-marker", "deleted", "--schema", SAMPLE_SCHEMA_DDL, "--max-files-per-batch", "2", *common],
                ["run-batch", shard, "--until-caught-up", "--json", *common],
            ]
            env = {**os.environ, OVERRIDE_ENV: "off"}  # the dumping JVM maps no dynamic archive
            for key in ("UPSERT_SPARK_REMOTE", "PYSPARK_SUBMIT_ARGS"):
                env.pop(key, None)
            progress(f"running a sample batch with Java {version} to record the classes it loads (about 30 s)")
            env["UPSERT_ARCHIVE_BUILDER_PID"] = str(os.getpid())
            done = _run_process_group([sys.executable, "-c", _DIE_WITH_PARENT + _DUMP_CHILD, tmp, json.dumps(commands)],
                                      env=env, timeout=1800)
            size = os.path.getsize(tmp) if os.path.exists(tmp) else 0
            if done.returncode != 0 or size == 0:
                raise ConfigurationError(
                    f"the sample batch that records the archive failed (exit {done.returncode}, archive "
                    f"{size} bytes); nothing was replaced: {done.stderr.strip()[-600:]}",
                    field="class_archive",
                )
            os.replace(tmp, target)
            digest = file_sha256(target)
            info = os.stat(target)
            _write_json_atomically(sidecar_path(target), {
                **runtime_identity(), "java_version": version, "archive_size": info.st_size,
                "archive_mtime_ns": info.st_mtime_ns, "archive_sha256": digest,
                # The file as it was hashed (archive_usable skips the hash while these hold).
                "archive_ino": info.st_ino, "archive_ctime_ns": info.st_ctime_ns,
                "created_at": time.time(),
            })
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.remove(tmp)
            shutil.rmtree(work, ignore_errors=True)
    seconds = round(time.monotonic() - started, 2)
    progress(f"archive written: {target} ({info.st_size / 2**20:.0f} MB) in {seconds} s")
    return {**archive_status(base), "built": True, "seconds": seconds}


def archive_status(base: str | None = None) -> dict[str, Any]:
    """The archive a new session would use: path, size, Java version, whether it is used.
    Deletes what killed builds left (:func:`remove_leftovers`)."""
    found = locate(base, full_check=True)
    remove_leftovers(_archive_dir(found["path"], base))
    path, sidecar = found["path"], found["sidecar"] or {}
    size = os.path.getsize(path) if path and os.path.exists(path) else None
    return {"path": path, "size": size, "java_version": sidecar.get("java_version"),
            "java": sidecar.get("java"), "pyspark": sidecar.get("pyspark"),
            "used": found["usable"], "damaged": found["reason"].startswith(DAMAGED), "reason": found["reason"]}


def remove_archive(base: str | None = None) -> dict[str, Any]:
    """Delete the archive a session would consider and its sidecar (under the build lock)."""
    found = locate(base)
    path = found["path"]
    remove_leftovers(_archive_dir(path, base))
    if path is None:
        return {"removed": False, "path": None, "reason": found["reason"]}
    with _locked(path + ".lock"):
        removed = False
        for name in (path, sidecar_path(path)):
            with contextlib.suppress(FileNotFoundError):
                os.remove(name)
                removed = True
    return {"removed": removed, "path": path}


# -- what killed builds leave

# A build's temporary directory: ``class-archive-<pid>-XXXXXXXX``; an earlier version's had
# no pid (``class-archive-XXXXXXXX``) and is removed once older than any build can last.
WORK_DIR_PREFIX = "class-archive-"
_WORK_DIR = re.compile(r"^class-archive-(?:(\d+)-)?[A-Za-z0-9_]+$")
# A build's temporary files: the dump and the sidecar, ``<name>.tmp-<pid>``.
_TEMP_FILE = re.compile(r"^.+\.(?:jsa|json)\.tmp-(\d+)$")
BUILD_TIMEOUT_SECONDS = 1800


def _run_process_group(argv: list[str], *, env: Mapping[str, str], timeout: float) -> subprocess.CompletedProcess:
    """Run ``argv`` as the leader of a new process group and wait for it; whatever ends the
    wait (a timeout, ^C, an error) kills the whole group, so no JVM of the child outlives it."""
    process = subprocess.Popen(argv, env=dict(env), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except BaseException:
        # The leader is not reaped yet, so its pid still names this group.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise
    return subprocess.CompletedProcess(argv, process.returncode, stdout, stderr)


def leftover_paths(directory: str, now: float | None = None,
                   alive: Callable[[int], bool] = pid_alive) -> list[str]:
    """The temporary files and directories in ``directory`` of builds whose process is gone
    (a live build's are kept, whoever runs it)."""
    now = time.time() if now is None else now
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    found = []
    for name in sorted(names):
        path = os.path.join(directory, name)
        temp, work = _TEMP_FILE.match(name), _WORK_DIR.match(name)
        if temp and not alive(int(temp.group(1))):
            found.append(path)
        elif work and os.path.isdir(path):
            if work.group(1) is not None:
                if not alive(int(work.group(1))):
                    found.append(path)
            else:
                with contextlib.suppress(OSError):
                    if now - os.stat(path).st_mtime > BUILD_TIMEOUT_SECONDS:
                        found.append(path)
    return found


def remove_leftovers(directory: str | None) -> list[str]:
    """Delete :func:`leftover_paths` of ``directory``; the paths deleted."""
    if not directory:
        return []
    removed = []
    for path in leftover_paths(directory):
        try:
            if os.path.isdir(path):
                shutil.rmtree(path)
            else:
                os.remove(path)
        except FileNotFoundError:
            continue
        except OSError as exc:
            log.warning("could not remove %s, left by an interrupted class archive build: %s", path, exc)
            continue
        removed.append(path)
    return removed


def _archive_dir(path: str | None, base: str | None) -> str | None:
    """The directory builds write into: the archive's, else the default one (when the
    setting is not ``off``)."""
    if path is not None:
        return os.path.dirname(path)
    setting = archive_setting()
    if setting == "off":
        return None
    return os.path.dirname(setting) if setting else os.path.join(state_root(base), ARCHIVE_SUBDIR)
