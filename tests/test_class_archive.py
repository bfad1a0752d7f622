"""The driver JVM's class-data-sharing archive: which archive a new session uses (decided from
files, no JVM), and a real archive that a fresh `upsertctl` process maps: a copy of the one the
suite built at its start (tests/conftest.py), or, when the suite runs without one, a build
through `upsertctl spark-archive build`."""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys

import pytest

from airflow_upsert_provider.engine.spark import class_archive as ca
from airflow_upsert_provider.engine.errors import ConfigurationError
from airflow_upsert_provider.sample_data import SAMPLE_SCHEMA_DDL, SampleSpec, generate
from tests.conftest import cli_env


# The archive tests/conftest.py built or found for the suite's JVMs (a path, "off", or unset),
# read before the fixture below hides it from each test.
SUITE_ARCHIVE = os.environ.get("UPSERT_CLASS_ARCHIVE")


@pytest.fixture(autouse=True)
def no_suite_archive(monkeypatch):
    """These tests build, find and judge their own archives: the one tests/conftest.py hands
    to the suite's JVMs through UPSERT_CLASS_ARCHIVE is not theirs."""
    monkeypatch.delenv("UPSERT_CLASS_ARCHIVE", raising=False)

CURRENT = {"java": "/opt/jdk/bin/java", "java_mtime_ns": 111, "java_size": 222, "pyspark": "4.2.0",
           "spark_home": "/site-packages/pyspark"}


def _archive(directory, name: str = "spark-4.2.0-java-17.0.15.jsa", content: bytes = b"x" * 64,
             **sidecar_changes) -> str:
    """An archive file and a sidecar describing it as built by CURRENT, then ``sidecar_changes``."""
    path = os.path.join(str(directory), name)
    with open(path, "wb") as handle:
        handle.write(content)
    info = os.stat(path)
    sidecar = {**CURRENT, "java_version": "17.0.15", "archive_size": info.st_size, "archive_mtime_ns": info.st_mtime_ns,
               "archive_sha256": hashlib.sha256(content).hexdigest(), "archive_ino": info.st_ino,
               "archive_ctime_ns": info.st_ctime_ns, **sidecar_changes}
    with open(ca.sidecar_path(path), "w") as handle:
        json.dump(sidecar, handle)
    return path


def _state(tmp_path):
    directory = tmp_path / "state" / ca.ARCHIVE_SUBDIR
    directory.mkdir(parents=True)
    return str(tmp_path / "state"), directory


def test_a_matching_archive_gives_the_option_and_quiet_cds_logging(tmp_path):
    base, directory = _state(tmp_path)
    path = _archive(directory)
    assert ca.session_java_options(base, environ={}, current=CURRENT) == (
        f"-XX:SharedArchiveFile={path}", "-Xlog:cds*=off")


def test_no_archive_gives_no_option(tmp_path):
    base, _ = _state(tmp_path)
    assert ca.session_java_options(base, environ={}, current=CURRENT) == ()
    assert ca.locate(str(tmp_path / "nowhere"), environ={}, current=CURRENT)["reason"] == "no archive built"


def test_an_empty_archive_is_not_used(tmp_path):
    base, directory = _state(tmp_path)
    _archive(directory, content=b"")
    assert ca.session_java_options(base, environ={}, current=CURRENT) == ()
    assert ca.locate(base, environ={}, current=CURRENT)["reason"] == "the archive is empty"


def test_an_archive_without_sidecar_or_replaced_after_its_sidecar_is_not_used(tmp_path):
    base, directory = _state(tmp_path)
    path = _archive(directory)
    with open(path, "ab") as handle:  # a rebuild that died after the archive, before the sidecar
        handle.write(b"more")
    assert ca.session_java_options(base, environ={}, current=CURRENT) == ()
    os.remove(ca.sidecar_path(path))
    assert ca.session_java_options(base, environ={}, current=CURRENT) == ()


def _damage_in_place(path: str) -> None:
    """Overwrite bytes inside the file, then give it back its mtime: same size, same mtime."""
    before = os.stat(path)
    with open(path, "r+b") as handle:
        handle.seek(before.st_size // 2)
        handle.write(os.urandom(8))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(path)
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)


def test_an_archive_damaged_in_place_is_not_used_and_a_warning_names_it(tmp_path, caplog):
    base, directory = _state(tmp_path)
    path = _archive(directory, content=b"CDS archive bytes " * 64)
    assert ca.session_java_options(base, environ={}, current=CURRENT) != ()
    _damage_in_place(path)
    with caplog.at_level(logging.WARNING, logger=ca.__name__):
        assert ca.session_java_options(base, environ={}, current=CURRENT) == ()
    assert [r.getMessage() for r in caplog.records if path in r.getMessage() and "damaged" in r.getMessage()]
    found = ca.locate(base, environ={}, current=CURRENT)
    assert found["path"] == path and not found["usable"] and found["reason"].startswith(ca.DAMAGED)


def test_a_session_hashes_the_archive_only_when_it_changed_since_it_was_hashed(tmp_path):
    """The checksum reads the whole file: a new session skips it while the inode and change time
    are those recorded at build; a write (even with the mtime put back) makes it read again."""
    base, directory = _state(tmp_path)
    path = _archive(directory, content=b"CDS archive bytes " * 64)
    sidecar = ca.read_sidecar(path)
    hashed = []

    def checksum(p):
        hashed.append(p)
        return ca.file_sha256(p)

    assert ca.archive_usable(path, sidecar, CURRENT, checksum) == (True, "usable") and hashed == []
    assert ca.archive_usable(path, sidecar, CURRENT, checksum, full_check=True) == (True, "usable")
    assert hashed == [path]
    _damage_in_place(path)
    usable, reason = ca.archive_usable(path, sidecar, CURRENT, checksum)
    assert not usable and reason.startswith(ca.DAMAGED) and hashed == [path, path]


def test_a_sidecar_without_a_checksum_is_not_trusted(tmp_path):
    base, directory = _state(tmp_path)
    _archive(directory, archive_sha256=None)
    assert ca.session_java_options(base, environ={}, current=CURRENT) == ()
    assert "checksum" in ca.locate(base, environ={}, current=CURRENT)["reason"]


def test_status_reports_a_damaged_archive_and_a_new_session_leaves_it_out(tmp_path):
    """Through upsertctl and the session's JVM options, with this machine's java and pyspark."""
    state = tmp_path / "state"
    directory = state / ca.ARCHIVE_SUBDIR
    directory.mkdir(parents=True)
    path = _archive(directory, name=ca.archive_name(ca.runtime_identity()["pyspark"], "17"),
                    content=b"CDS archive bytes " * 64, **ca.runtime_identity())
    _damage_in_place(path)
    env = {**os.environ, "UPSERT_STATE_DIR": str(state)}
    env.pop("UPSERT_CLASS_ARCHIVE", None)
    done = subprocess.run([sys.executable, "-m", "airflow_upsert_provider.cli", "spark-archive", "status", "--json"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    out = json.loads(done.stdout)
    assert out["path"] == path and out["used"] is False and out["damaged"] is True
    probe = ("from airflow_upsert_provider.engine.spark.session import driver_java_options\n"
             "print(driver_java_options())\n")
    seen = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert seen.returncode == 0, seen.stderr
    assert "SharedArchiveFile" not in seen.stdout
    assert f"the class archive {path} is not used: damaged" in seen.stderr


@pytest.mark.parametrize("key, value", [("java_mtime_ns", 999), ("java", "/other/bin/java"), ("java_size", 1),
                                        ("pyspark", "4.1.0"), ("spark_home", "/other/pyspark")])
def test_a_stale_sidecar_disables_the_archive(tmp_path, key, value):
    base, directory = _state(tmp_path)
    _archive(directory, **{key: value})
    assert ca.session_java_options(base, environ={}, current=CURRENT) == ()
    assert key in ca.locate(base, environ={}, current=CURRENT)["reason"]


def test_the_archive_matching_this_java_wins_among_versions(tmp_path):
    base, directory = _state(tmp_path)
    _archive(directory, name="spark-4.2.0-java-11.0.2.jsa", java="/jdk11/bin/java")
    current = _archive(directory, name="spark-4.2.0-java-17.0.15.jsa")
    _archive(directory, name="spark-4.1.0-java-17.0.15.jsa")  # another pyspark: never considered
    assert ca.session_java_options(base, environ={}, current=CURRENT)[0] == f"-XX:SharedArchiveFile={current}"


def test_override_off_disables_even_a_usable_archive(tmp_path):
    base, directory = _state(tmp_path)
    _archive(directory)
    assert ca.session_java_options(base, environ={"UPSERT_CLASS_ARCHIVE": "off"}, current=CURRENT) == ()
    assert ca.session_java_options(base, environ={"UPSERT_CLASS_ARCHIVE": " OFF "}, current=CURRENT) == ()


def test_override_path_names_the_archive_file(tmp_path):
    path = _archive(tmp_path, name="mine.jsa")
    assert ca.session_java_options(None, environ={"UPSERT_CLASS_ARCHIVE": path}, current=CURRENT)[0] == \
        f"-XX:SharedArchiveFile={path}"
    missing = str(tmp_path / "missing.jsa")
    assert ca.session_java_options(None, environ={"UPSERT_CLASS_ARCHIVE": missing}, current=CURRENT) == ()


@pytest.mark.parametrize("value", ["", "  ", "on", "true", "0", "disabled", "/tmp/"])
def test_an_invalid_override_is_a_configuration_error_naming_the_variable(value):
    with pytest.raises(ConfigurationError, match="UPSERT_CLASS_ARCHIVE"):
        ca.session_java_options(None, environ={"UPSERT_CLASS_ARCHIVE": value}, current=CURRENT)


def test_a_directory_override_is_refused(tmp_path):
    with pytest.raises(ConfigurationError, match="UPSERT_CLASS_ARCHIVE"):
        ca.archive_setting({"UPSERT_CLASS_ARCHIVE": str(tmp_path)})


def test_java_resolves_like_spark_java_home_first_then_path(tmp_path):
    home = tmp_path / "jdk"
    (home / "bin").mkdir(parents=True)
    (home / "bin" / "java").write_text("#!/bin/sh\n")
    (home / "bin" / "java").chmod(0o755)
    assert ca.resolve_java({"JAVA_HOME": str(home), "PATH": "/usr/bin"}) == str(home / "bin" / "java")
    assert ca.resolve_java({"JAVA_HOME": str(tmp_path / "none")}) is None
    assert ca.resolve_java({"PATH": str(home / "bin")}) == str(home / "bin" / "java")


def test_a_newer_java_binary_makes_the_archive_stale(tmp_path):
    """The real identity: the same files, then the java binary touched (an upgrade in place)."""
    home = tmp_path / "jdk"
    (home / "bin").mkdir(parents=True)
    java = home / "bin" / "java"
    java.write_text("#!/bin/sh\n")
    env = {"JAVA_HOME": str(home)}
    base, directory = _state(tmp_path)
    _archive(directory, **ca.runtime_identity(env))
    assert ca.session_java_options(base, environ=env) != ()
    os.utime(java, ns=(1, 1))
    assert ca.session_java_options(base, environ=env) == ()


def test_the_name_keys_pyspark_and_java_versions():
    assert ca.archive_name("4.2.0", "17.0.15") == "spark-4.2.0-java-17.0.15.jsa"
    assert ca.archive_name("4.2.0.dev1", "21/ea") == "spark-4.2.0.dev1-java-21_ea.jsa"


# -- a real archive


def _upsertctl(argv, env, timeout=600):
    return subprocess.run([sys.executable, "-m", "airflow_upsert_provider.cli", *argv], env=env,
                          capture_output=True, text=True, timeout=timeout)


def _usable_suite_archive() -> str | None:
    """The suite's archive when it is one this machine's JVMs may map, else None."""
    if not SUITE_ARCHIVE or SUITE_ARCHIVE == "off" or not os.path.isfile(SUITE_ARCHIVE):
        return None
    usable, _ = ca.archive_usable(SUITE_ARCHIVE, ca.read_sidecar(SUITE_ARCHIVE), ca.runtime_identity())
    return SUITE_ARCHIVE if usable else None


def _loaded_from_archives(logs: str) -> tuple[int, int]:
    """Classes a JVM's class+load log says came from the JDK's base CDS archive and from the
    top (dynamic) layer."""
    base = top = 0
    for path in glob.glob(logs):
        with open(path, errors="replace") as handle:
            for line in handle:
                top += "source: shared objects file (top)" in line
                base += line.rstrip().endswith("source: shared objects file")
    return base, top


@pytest.mark.slow
def test_a_built_archive_is_mapped_by_a_fresh_run_batch(tmp_path, sqlite_url):
    state = str(tmp_path / "state")
    env = cli_env(sqlite_url, str(tmp_path / "blob"), UPSERT_STATE_DIR=state)
    for key in ("UPSERT_CLASS_ARCHIVE", "UPSERT_SPARK_REMOTE", "JAVA_TOOL_OPTIONS"):
        env.pop(key, None)

    suite_archive = _usable_suite_archive()
    if suite_archive:
        # The suite's own archive, built by the same build (tests/conftest.py, on a fresh
        # checkout) a minute ago: a copy (size and mtime kept, so its checksum is read again)
        # instead of a second build's two JVMs. What the build left beside it is checked there.
        built_in = os.path.dirname(suite_archive)
        os.makedirs(os.path.join(state, ca.ARCHIVE_SUBDIR))
        target = os.path.join(state, ca.ARCHIVE_SUBDIR, os.path.basename(suite_archive))
        shutil.copy2(suite_archive, target)
        shutil.copy2(ca.sidecar_path(suite_archive), ca.sidecar_path(target))
    else:
        build = _upsertctl(["spark-archive", "build", "--json"], env, timeout=900)
        assert build.returncode == 0, build.stderr[-3000:]
        assert json.loads(build.stdout)["built"], build.stdout
        built_in = os.path.join(state, ca.ARCHIVE_SUBDIR)
    assert not glob.glob(os.path.join(built_in, "*.tmp-*")) and not glob.glob(os.path.join(built_in, "class-archive-*"))
    again = _upsertctl(["spark-archive", "build", "--json"], env)
    assert again.returncode == 0, again.stderr[-2000:]
    built = json.loads(again.stdout)
    assert built["built"] is False and built["used"] and built["size"] > 10 * 2**20, built
    assert built["path"].startswith(os.path.join(state, ca.ARCHIVE_SUBDIR) + os.sep)

    landing = tmp_path / "landing"
    generate(str(landing), SampleSpec(records=2000, keys=500, partitions=2, segments_per_partition=2))
    init = _upsertctl(["init", "s", "--source", f"dir:{landing}", "--key", "id", "--order-by", "updated_at",
                       "--delete-marker", "deleted", "--schema", SAMPLE_SCHEMA_DDL], {**env, "UPSERT_CLASS_ARCHIVE": "off"})
    assert init.returncode == 0, init.stderr[-2000:]

    # The driver JVM logs where each class came from; the launcher JVM logs too (%p: one file each).
    logs = str(tmp_path / "classes-%p.log")
    batch = _upsertctl(["run-batch", "s", "--json"], {**env, "JAVA_TOOL_OPTIONS": f"-Xlog:class+load=info:file={logs}"})
    assert batch.returncode == 0, batch.stderr[-3000:]
    out = json.loads(batch.stdout)  # nothing else on stdout: the CDS logging is off
    assert out["batches"][0]["outcome"] == "committed"
    base, top = _loaded_from_archives(logs.replace("%p", "*"))
    assert top > 1000 and base > 0, (base, top)

    # "(top)" names the dynamic layer only: the same log shows the JDK's base archive's classes
    # without it. Whether a JVM gets the archive at all (UPSERT_CLASS_ARCHIVE=off, a stale or
    # damaged one) is decided from files: the tests above.

    status = _upsertctl(["spark-archive", "status", "--json"], env)
    assert status.returncode == 0 and json.loads(status.stdout)["used"] is True
    removed = _upsertctl(["spark-archive", "remove", "--json"], env)
    assert removed.returncode == 0 and json.loads(removed.stdout)["removed"] is True
    assert not os.path.exists(built["path"]) and not os.path.exists(ca.sidecar_path(built["path"]))
    status = _upsertctl(["spark-archive", "status"], env)
    assert status.returncode == 2 and "no archive built" in status.stdout


def _dead_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(done.stdout)


def test_leftovers_of_builds_whose_process_is_gone_are_removed_and_a_live_builds_kept(tmp_path):
    base, directory = _state(tmp_path)
    archive = _archive(directory, content=b"kept archive")
    dead, live = _dead_pid(), os.getpid()
    stale = [f"{archive}.tmp-{dead}", f"{archive}.json.tmp-{dead}"]
    kept = [f"{archive}.tmp-{live}", f"{archive}.json.tmp-{live}"]
    for path in stale + kept:
        with open(path, "wb") as handle:
            handle.write(b"half a dump")
    stale_dir, kept_dir = directory / f"class-archive-{dead}-ab12cd34", directory / f"class-archive-{live}-ef56gh78"
    legacy_old, legacy_new = directory / "class-archive-k2j4h5g6", directory / "class-archive-z9y8x7w6"
    for work in (stale_dir, kept_dir, legacy_old, legacy_new):
        (work / "landing").mkdir(parents=True)
    os.utime(legacy_old, (1, 1))  # older than any build lasts: an earlier version's, without a pid

    assert ca.remove_leftovers(str(directory)) == sorted(stale + [str(stale_dir), str(legacy_old)])
    assert all(os.path.exists(p) for p in [*kept, kept_dir, legacy_new, archive, ca.sidecar_path(archive)])
    assert not any(os.path.exists(p) for p in [*stale, stale_dir, legacy_old])


# Stands in for the dumping child (the real one prefixed with the same lines that make it die
# with its builder): it starts a grandchild as the child's JVM would, starts writing the dump,
# and both hold the FIFO open; the test sees them gone when the FIFO reads end-of-file.
FAKE_DUMP_CHILD = """
import os, subprocess, sys
with open(sys.argv[1], "wb") as handle:
    handle.write(b"the start of a dump")
fifo = open(os.environ["TEST_FIFO"], "w")
jvm = subprocess.Popen([sys.executable, "-c", "import time\\nwhile True: time.sleep(60)"], pass_fds=(fifo.fileno(),))
fifo.write(f"{os.getpid()} {jvm.pid}\\n")
fifo.flush()
jvm.wait()
"""

BUILDER = """
import sys
from airflow_upsert_provider.engine.spark import class_archive
class_archive._DUMP_CHILD = sys.argv[2]
class_archive.build_archive(sys.argv[1], rows=200)
"""


def test_a_killed_build_takes_its_child_and_jvm_with_it_and_the_next_status_removes_its_files(tmp_path):
    import select
    import signal

    state = tmp_path / "state"
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    env = {**os.environ, "TEST_FIFO": str(fifo)}
    env.pop("UPSERT_CLASS_ARCHIVE", None)
    builder = subprocess.Popen([sys.executable, "-c", BUILDER, str(state), FAKE_DUMP_CHILD], env=env)
    orphans: list[int] = []
    try:
        with open(fifo) as reader:  # opens once the child opened it for writing
            orphans = [int(pid) for pid in reader.readline().split()]
            builder.kill()
            builder.wait()
            # End-of-file: every holder (the child and its "JVM") is dead. The bound only keeps
            # a failing run from hanging; nothing here depends on how fast it goes.
            ready, _, _ = select.select([reader], [], [], 120)
            assert ready and reader.read() == "", "the build's child outlived it"
        directory = state / ca.ARCHIVE_SUBDIR
        left = sorted(os.listdir(directory))
        assert any(".jsa.tmp-" in name for name in left) and any(n.startswith("class-archive-") for n in left)
        ca.archive_status(str(state))
        assert sorted(os.listdir(directory)) == sorted(n for n in left if n.endswith(".lock")), left
    finally:
        for pid in orphans:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
