"""Every bad input or environment fault of `upsertctl` gets a documented exit code and a clear
message, never a traceback (issue 7 items 8 and 12, sweep rows I6-I17, F2, F3)."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys

import pytest

from airflow_upsert_provider import cli
from airflow_upsert_provider.cli.context import Context
from airflow_upsert_provider.engine.config import ShardConfig
from airflow_upsert_provider.engine.errors import BadInputError, ConfigurationError
from airflow_upsert_provider.sample_data import SAMPLE_SCHEMA_DDL, SampleSpec, generate
from tests.conftest import cli_env
from tests.helpers import batch, cli_store, landing_env, make_shard, remount, sample_config
from tests.helpers import run_cli as run
from tests.maintenance.support import tree

SPEC = SampleSpec(records=200, keys=40, partitions=1, segments_per_partition=2, seed=7)
# Offsets 0, 10, 20, 30 in p0 and p1; two files a batch.
PRUNE_SPEC = SampleSpec(records=160, keys=40, partitions=2, segments_per_partition=4, seed=5)


@pytest.fixture
def env(tmp_path, monkeypatch):
    return landing_env(tmp_path, monkeypatch, SPEC)



def assert_clean_error(code, err, expected_code, *fragments):
    assert code == expected_code, err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in err, err


def commit(shard, ts: int) -> None:
    """Bind batch ``ts`` and commit it with an empty run (no Spark): what a prune looks at."""
    assert shard.mint_binding(ts, minted_by="test") is not None
    assert shard.compare_and_append(ts, ts + 1, batch(ts, token=f"t{ts}"), epoch=0).upper == ts + 1


# -- ShardConfig: refused at init, not at the first run (I15, I16) ---------------------------

def test_delete_marker_must_be_a_boolean_column(tmp_path):
    with pytest.raises(ConfigurationError, match="delete marker 'name' must be a BOOLEAN column, not string"):
        sample_config(str(tmp_path), delete_marker="name")


def test_duplicate_schema_columns_are_refused(tmp_path):
    schema = json.dumps({"type": "struct", "fields": [
        {"name": "id", "type": "long", "nullable": True, "metadata": {}},
        {"name": "ID", "type": "long", "nullable": True, "metadata": {}},
    ]})
    with pytest.raises(ConfigurationError, match=r"duplicate column\(s\) in the schema: 'ID'"):
        ShardConfig(source=f"dir:{tmp_path}", keys=("id",), schema=schema)


def test_init_refuses_a_string_delete_marker_and_duplicate_columns(spark, env, capsys):
    code, _, err = run(capsys, "init", "s", "--source", f"dir:{env}", "--key", "id",
                       "--schema", SAMPLE_SCHEMA_DDL, "--delete-marker", "name")
    assert_clean_error(code, err, 2, "delete marker 'name' must be a BOOLEAN column")
    code, _, err = run(capsys, "init", "s", "--source", f"dir:{env}", "--key", "id",
                       "--schema", "id BIGINT, id BIGINT, name STRING")
    assert_clean_error(code, err, 2, "duplicate column(s) in the schema: 'id'")
    assert run(capsys, "status", "s", "--no-rows")[0] == 2  # nothing was created


# -- no silent defaults (I17) -------------------------------------------------------------------

@pytest.mark.parametrize("option", ["--buckets", "--max-files-per-batch"])
def test_zero_is_refused_not_replaced_by_the_default(env, capsys, option):
    code, out, err = run(capsys, "init", "s", "--source", f"dir:{env}", "--key", "id", "--schema", SAMPLE_SCHEMA_DDL,
                         option, "0", "--json")
    assert_clean_error(code, err, 2, f"{option} takes an integer from 1 to ")
    assert json.loads(out)["field"] == option[2:].replace("-", "_")
    assert run(capsys, "status", "s", "--no-rows")[0] == 2


# -- the blob root: checked up front (I6, I7) and a full disk (F2) -----------------------------

def test_read_only_blob_root_is_a_clear_error_before_spark_writes(spark, env, capsys, tmpfs, monkeypatch):
    root = tmpfs("4m")
    monkeypatch.setenv("UPSERT_BLOB_ROOT", str(root))
    assert run(capsys, "init", "s", "--source", f"dir:{env}", "--key", "id", "--schema", SAMPLE_SCHEMA_DDL)[0] == 0
    remount(root, "ro")
    code, _, err = run(capsys, "run-batch", "s")
    assert_clean_error(code, err, 2, f"blob root {root} is not writable: Read-only file system")
    code, _, err = run(capsys, "init", "t", "--source", f"dir:{env}", "--key", "id", "--schema", SAMPLE_SCHEMA_DDL)
    assert_clean_error(code, err, 2, "is not writable")
    # Reading needs no write access.
    assert run(capsys, "status", "s", "--no-rows", "--json")[0] == 0


def test_blob_root_that_is_a_file_is_a_clear_error(spark, env, capsys, tmp_path, monkeypatch):
    assert run(capsys, "init", "s", "--source", f"dir:{env}", "--key", "id", "--schema", SAMPLE_SCHEMA_DDL)[0] == 0
    a_file = tmp_path / "a-file"
    a_file.write_text("not a directory")
    monkeypatch.setenv("UPSERT_BLOB_ROOT", str(a_file))
    for argv in (["init", "t", "--source", f"dir:{env}", "--key", "id"], ["run-batch", "s"], ["read", "s"],
                 ["status", "s"], ["gc", "s"], ["compact", "s"]):
        code, _, err = run(capsys, *argv)
        assert_clean_error(code, err, 2, f"blob root {a_file} is not a directory")


def test_full_blob_root_fails_clearly_commits_nothing_and_a_rerun_succeeds(spark, tmp_path, capsys, tmpfs, monkeypatch):
    root = tmpfs("256k")
    landing = tmp_path / "landing"
    # Incompressible values: the Parquet run of this batch cannot fit in 256 KiB.
    big = SampleSpec(records=20000, keys=20000, partitions=1, segments_per_partition=1, seed=1)
    generate(str(landing), big)
    monkeypatch.setenv("UPSERT_CONSENSUS_URL", f"sqlite:///{tmp_path / 'c.db'}")
    monkeypatch.setenv("UPSERT_BLOB_ROOT", str(root))
    assert run(capsys, "init", "s", "--source", f"dir:{landing}", "--key", "id", "--schema", SAMPLE_SCHEMA_DDL)[0] == 0
    code, out, err = run(capsys, "run-batch", "s", "--json")
    assert_clean_error(code, err, 2, "No space left on device", "nothing was committed")
    error = json.loads(out)
    assert error["error"] == "BlobWriteFailed" and error["retryable"] is False and error["ts"] == 0
    assert json.loads(run(capsys, "status", "s", "--no-rows", "--json")[1])["upper"] == 0
    staged = [os.path.join(d, f) for d, _, files in os.walk(root) for f in files]
    assert staged == [], staged  # the attempt's files are gone
    remount(root, "size=64m")
    code, out, err = run(capsys, "run-batch", "s", "--json")
    assert code == 0, err
    assert json.loads(out)["upper"] == 1


# -- the consensus URL and store (I9, I10, I11, F3) -----------------------------------------------

def test_sqlite_path_below_a_file_is_a_clear_error(capsys, tmp_path):
    code, _, err = run(capsys, "--consensus", "sqlite:////etc/passwd/x.db", "status", "s", "--no-rows")
    assert_clean_error(code, err, 2, "cannot create the directory /etc/passwd of the SQLite consensus: ")


def test_text_file_as_sqlite_store_is_a_clear_error(capsys, tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("these are my notes, not a database\n" * 200)
    code, out, err = run(capsys, "--consensus", f"sqlite:///{text}", "status", "s", "--no-rows", "--json")
    assert_clean_error(code, err, 2, f"consensus store sqlite:///{text} is not a SQLite database")
    assert json.loads(out)["error"] == "ConfigurationError"
    assert text.read_text().startswith("these are my notes")  # untouched


# A cut-off file is damaged (exit 4: restore); a file whose header is not SQLite's may be the
# wrong file as well as a damaged one (exit 2: check the URL first).
@pytest.mark.parametrize("damage, expected_code", [("truncated", 4), ("garbage_header", 2)])
def test_damaged_sqlite_store_is_a_clear_error(capsys, tmp_path, damage, expected_code):
    db = tmp_path / "c.db"
    url = f"sqlite:///{db}"
    from airflow_upsert_provider.engine.store.registry import open_consensus

    store = open_consensus(url)
    for i in range(200):
        store.create_shard(f"s{i}", "{}" * 50)
    store.dispose()
    for suffix in ("-wal", "-shm"):
        if os.path.exists(f"{db}{suffix}"):
            os.unlink(f"{db}{suffix}")
    size = os.path.getsize(db)
    with open(db, "r+b") as handle:
        if damage == "truncated":
            handle.truncate(size // 2)
        else:
            handle.write(b"\x00garbage" * 16)
    code, _, err = run(capsys, "--consensus", url, "status", "s7", "--no-rows")
    assert code == expected_code, err
    assert "Traceback" not in err and f"consensus store {url}" in err
    assert "restore the shards from a checkpoint" in err


def test_postgres_url_with_an_unknown_option_is_a_clear_error(capsys):
    url = "postgresql://u:hunter2secret@127.0.0.1:1/db?foo=bar"
    code, _, err = run(capsys, "--consensus", url, "status", "s", "--no-rows")
    assert_clean_error(code, err, 2, 'invalid connection option "foo"')
    assert "hunter2secret" not in err


# -- output (I13, I14) ------------------------------------------------------------------------------

def test_read_to_an_unwritable_path_is_a_clear_error(spark, env, capsys):
    assert run(capsys, "init", "s", "--source", f"dir:{env}", "--key", "id", "--schema", SAMPLE_SCHEMA_DDL)[0] == 0
    code, _, err = run(capsys, "read", "s", "--out", "/nonexistent/x")
    assert_clean_error(code, err, 2, "cannot write --out /nonexistent/x: No such file or directory")


def test_read_into_a_closed_pipe_exits_quietly(spark, env, capsys, tmp_path):
    # More rows than a pipe buffer holds, so that the writer is still writing when it closes.
    generate(str(env), SampleSpec(records=8000, keys=8000, partitions=1, segments_per_partition=1, seed=2))
    assert run(capsys, "init", "s", "--source", f"dir:{env}", "--key", "id", "--schema", SAMPLE_SCHEMA_DDL)[0] == 0
    assert run(capsys, "run-batch", "s")[0] == 0
    environment = cli_env(os.environ["UPSERT_CONSENSUS_URL"], os.environ["UPSERT_BLOB_ROOT"])
    reader = subprocess.Popen(
        [sys.executable, "-m", "airflow_upsert_provider.cli", "read", "s"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=environment,
    )
    first = [reader.stdout.readline() for _ in range(2)]
    reader.stdout.close()  # what `| head -2` does
    err = reader.stderr.read().decode()
    code = reader.wait(timeout=120)
    assert all(json.loads(line)["id"] is not None for line in first)
    assert code == 141, err
    assert "Traceback" not in err and "BrokenPipe" not in err and "Exception" not in err, err


def test_unexpected_error_is_one_line_with_exit_1(env, capsys, monkeypatch):
    def boom(ctx, args):
        raise RuntimeError("something nobody planned for\nsecond line")

    monkeypatch.setitem(cli.COMMANDS, "status", boom)
    code, _, err = run(capsys, "status", "s")
    assert_clean_error(code, err, 1, "unexpected error: RuntimeError: something nobody planned for", "UPSERT_DEBUG=1")
    assert "second line" not in err
    monkeypatch.setenv("UPSERT_DEBUG", "1")
    with pytest.raises(RuntimeError):
        cli.main(["status", "s"])


def test_a_full_disk_in_any_command_is_exit_2_not_unexpected(env, capsys, monkeypatch):
    def compaction_on_a_full_disk(ctx, args):
        raise RuntimeError("An error occurred while calling o51.parquet.\n: TASK_WRITE_FAILED ...\n"
                           "Caused by: java.io.IOException: No space left on device")

    monkeypatch.setitem(cli.COMMANDS, "compact", compaction_on_a_full_disk)
    monkeypatch.setattr(Context, "__init__", lambda self, args: None)
    code, _, err = run(capsys, "compact", "s")
    # The JVM named no file: the line says so and where Spark writes, without claiming which.
    assert_clean_error(code, err, 2, "a write failed: No space left on device (no path was named: Spark writes "
                       f"under the blob root {os.environ['UPSERT_BLOB_ROOT']} and its local directories)")


def test_a_write_failure_names_the_path_the_jvm_or_the_os_names(env, capsys, monkeypatch):
    def jvm_write_to_a_read_only_mount(ctx, args):
        raise RuntimeError("An error occurred while calling o51.parquet.\n: java.io.FileNotFoundException: "
                           "/mnt/scratch/blockmgr-1/0e/shuffle_0_1_0.data (Read-only file system)")

    def os_write_to_a_full_disk(ctx, args):
        try:
            raise OSError(errno.ENOSPC, "No space left on device", "/srv/landing/p0/.retention.jsonl")
        except OSError as exc:
            raise RuntimeError("while pruning") from exc

    monkeypatch.setattr(Context, "__init__", lambda self, args: None)
    monkeypatch.setitem(cli.COMMANDS, "compact", jvm_write_to_a_read_only_mount)
    code, _, err = run(capsys, "compact", "s")
    assert_clean_error(code, err, 2, "writing /mnt/scratch/blockmgr-1/0e/shuffle_0_1_0.data failed: "
                       "Read-only file system; nothing was committed")
    assert "blob root" not in err
    monkeypatch.setitem(cli.COMMANDS, "source", os_write_to_a_full_disk)
    code, _, err = run(capsys, "source", "prune", "s")
    assert_clean_error(code, err, 2, "writing /srv/landing/p0/.retention.jsonl failed: No space left on device")
    assert "blob root" not in err


def test_a_store_failure_an_executor_carried_is_reported_in_its_class_not_as_unexpected(env, capsys, monkeypatch):
    """A compaction or read whose executor's GET failed beyond the bound reaches the CLI as a Spark error
    quoting the task's carried BlobUnavailable: it exits 2, retryable, as the driver's own would."""
    from airflow_upsert_provider.engine.errors import BlobUnavailable
    from airflow_upsert_provider.engine.spark.executor_errors import ExecutorError

    carried = BlobUnavailable("reading s3://lake/s/runs/a.parquet failed: SERVICE_UNAVAILABLE", operation="read",
                              bucket="lake", key="s/runs/a.parquet", endpoint="http://127.0.0.1:9", reason="503")

    def read_whose_executor_failed(ctx, args):
        raise RuntimeError(f"An exception was thrown from the Python worker: {ExecutorError(carried)}")

    monkeypatch.setattr(Context, "__init__", lambda self, args: None)
    monkeypatch.setitem(cli.COMMANDS, "compact", read_whose_executor_failed)  # a compaction reads the runs
    code, out, err = run(capsys, "compact", "s", "--json")
    assert_clean_error(code, err, 2, "reading s3://lake/s/runs/a.parquet failed: SERVICE_UNAVAILABLE")
    assert "unexpected" not in err
    assert json.loads(out) == {"error": "BlobUnavailable", "message": carried.message, "retryable": True,
                               **carried.details}


# -- a directory that is not the blob root, read-only ----------------------------------------------

def test_a_read_only_landing_directory_is_named_by_source_prune(tmp_path, monkeypatch, sqlite_url, capsys, tmpfs):
    consensus, blob = cli_store(tmp_path, monkeypatch, sqlite_url)
    landing = tmpfs("4m", name="landing")
    shard = make_shard(consensus, blob, tmp_path, spec=PRUNE_SPEC, max_files_per_batch=2)
    for ts in range(3):
        commit(shard, ts)
    remount(landing, "ro")
    before = tree(str(landing))
    code, _, err = run(capsys, "source", "prune", "orders", "--below", "committed")
    assert_clean_error(code, err, 2, f"writing {landing}/p0/", "failed: Read-only file system",
                       "nothing was committed")
    assert "blob root" not in err
    assert tree(str(landing)) == before
    consensus.dispose()


@pytest.mark.parametrize("command", [["spark-server", "start"], ["spark-archive", "build"]])
def test_a_read_only_state_directory_is_named(tmp_path, monkeypatch, capsys, tmpfs, command):
    # The build goes to --state-dir, not to the suite's archive (tests/conftest.py).
    monkeypatch.delenv("UPSERT_CLASS_ARCHIVE", raising=False)
    state = tmpfs("1m", name="state")
    remount(state, "ro")
    subdir = "spark-server" if command[0] == "spark-server" else "class-archive"
    code, _, err = run(capsys, *command, "--state-dir", str(state))
    assert_clean_error(code, err, 2, f"writing {state}/{subdir} failed: Read-only file system")
    assert "blob root" not in err
    assert os.listdir(state) == []


# -- every number option: 64 bits, finite, in range; else an error naming it (exit 2) --------------

TOO_BIG = "9" * 20  # above 2**63-1
NOT_A_FLOAT = "9" * 400  # float() makes it infinite


@pytest.mark.parametrize("argv, option", [
    (["stream", "history", "s", "--limit", TOO_BIG], "--limit"),
    (["read", "s", "--as-of", TOO_BIG], "--as-of"),
    (["compact", "s", "--since", TOO_BIG], "--since"),
    (["compact", "s", "--since", "-1"], "--since"),
    (["recover", "seek", "s", "--epoch", "1" + "0" * 23], "--epoch"),
    (["init", "s", "--source", "dir:/x", "--key", "id", "--buckets", TOO_BIG], "--buckets"),
    (["init", "s", "--source", "dir:/x", "--key", "id", "--max-files-per-batch", TOO_BIG], "--max-files-per-batch"),
    (["init", "s", "--source", "kafka:t", "--key", "id", "--max-records-per-batch", TOO_BIG], "--max-records-per-batch"),
    (["run-batch", "s", "--max-batches", TOO_BIG], "--max-batches"),
    (["checkpoint", "create", "s", "--keep-last", TOO_BIG], "--keep-last"),
    (["checkpoint", "create", "s", "--keep-within", "nan"], "--keep-within"),
    (["checkpoint", "create", "s", "--keep-within", NOT_A_FLOAT], "--keep-within"),
    (["gc", "s", "--grace", "nan"], "--grace"),
    (["gc", "s", "--grace", "inf"], "--grace"),
    (["stream", "stop", "s", "--drain", "nan"], "--drain"),
    (["stream", "stop", "s", "--drain", "inf"], "--drain"),
    (["spark-server", "start", "--timeout", "-1"], "--timeout"),
    (["spark-server", "start", "--port", TOO_BIG], "--port"),
        (["frontier", "status", "s", "--consecutive-breaches", TOO_BIG], "--consecutive-breaches"),
])
def test_a_number_option_out_of_range_is_an_error_naming_it(env, capsys, monkeypatch, argv, option):
    monkeypatch.setattr(Context, "spark", lambda self: pytest.fail("a Spark session was started"))
    code, _, err = run(capsys, *argv)
    assert_clean_error(code, err, 2, f"upsertctl: {option} takes ")
    assert not os.path.exists(os.environ["UPSERT_BLOB_ROOT"])  # nothing was opened


def test_a_long_number_is_quoted_short(capsys):
    code, _, err = run(capsys, "gc", "s", "--grace", NOT_A_FLOAT)
    assert code == 2 and "(400 characters)" in err and NOT_A_FLOAT not in err


def test_a_limit_beyond_64_bits_on_a_real_shard_is_refused_not_unexpected(tmp_path, monkeypatch, sqlite_url, capsys):
    consensus, blob = cli_store(tmp_path, monkeypatch, sqlite_url)
    make_shard(consensus, blob, tmp_path, spec=PRUNE_SPEC)
    code, out, err = run(capsys, "stream", "history", "orders", "--limit", TOO_BIG, "--json")
    assert_clean_error(code, err, 2, f"--limit takes an integer from 1 to 2**63-1, not '{TOO_BIG}'")
    assert {k: v for k, v in json.loads(out).items() if k != "message"} == {
        "error": "ConfigurationError", "retryable": False, "field": "limit"}
    code, out, _ = run(capsys, "stream", "history", "orders", "--limit", str(2**63 - 1), "--json")
    assert code == 0 and json.loads(out)["shard"] == "orders"
    consensus.dispose()


def test_keep_within_nan_keeps_every_checkpoint(tmp_path, monkeypatch, sqlite_url, capsys):
    consensus, blob = cli_store(tmp_path, monkeypatch, sqlite_url)
    shard = make_shard(consensus, blob, tmp_path, spec=PRUNE_SPEC)
    for ts in range(2):
        commit(shard, ts)
        assert run(capsys, "checkpoint", "create", "orders")[0] == 0
    code, _, err = run(capsys, "checkpoint", "create", "orders", "--keep-within", "nan")
    listed = run(capsys, "checkpoint", "list", "orders", "--json")[1]
    assert [c["upper"] for c in json.loads(listed)["checkpoints"]] == [1, 2]
    assert_clean_error(code, err, 2, "--keep-within takes a finite number of seconds above zero, not 'nan'")
    consensus.dispose()


def test_grace_nan_deletes_nothing_in_the_grace_period(tmp_path, monkeypatch, sqlite_url, capsys):
    consensus, blob = cli_store(tmp_path, monkeypatch, sqlite_url)
    make_shard(consensus, blob, tmp_path, spec=PRUNE_SPEC)
    # A writer's staging directory of a moment ago: no commit names it yet.
    staged = tmp_path / "blob" / "orders" / "runs" / "ts=000000000000" / "w-1234" / "part-0.parquet"
    staged.parent.mkdir(parents=True)
    staged.write_bytes(b"staging")
    code, out, _ = run(capsys, "gc", "orders", "--dry-run", "--json")
    assert code == 0 and json.loads(out)["items"] == []
    code, _, err = run(capsys, "gc", "orders", "--grace", "nan")
    assert staged.read_bytes() == b"staging"
    assert_clean_error(code, err, 2, "--grace takes a finite number of seconds >= 0, not 'nan'")
    consensus.dispose()


def test_a_duration_too_long_to_be_finite_is_refused(env, capsys):
    from airflow_upsert_provider.engine.common.time_text import parse_duration

    for text in (NOT_A_FLOAT, NOT_A_FLOAT + "h", "1" + "0" * 306 + "h"):
        with pytest.raises(ConfigurationError) as raised:
            parse_duration(text, field="--for")
        assert "--for: the duration of " in raised.value.message and "is too long to be finite" in raised.value.message
    assert parse_duration("9" * 300) == float("9" * 300)  # long, still finite
    code, out, err = run(capsys, "run-batch", "s", "--continuous", "--for", NOT_A_FLOAT, "--json")
    assert_clean_error(code, err, 2, "--for: the duration of 400 characters is too long to be finite")
    assert json.loads(out)["field"] == "--for"


# -- the Kafka client config file ----------------------------------------------------------------

def test_a_kafka_config_that_is_not_utf8_names_the_file_never_its_content(tmp_path, monkeypatch, capsys):
    cli_store(tmp_path, monkeypatch, f"sqlite:///{tmp_path / 'c.db'}")
    raw = b'{"bootstrap.servers": "127.0.0.1:9092", "sasl.password": "hunter2\xe9"}'  # Latin-1, not UTF-8
    config = tmp_path / "k.json"
    config.write_bytes(raw)
    code, out, err = run(capsys, "init", "ko", "--source", "kafka:orders", "--key", "id", "--schema", "id BIGINT",
                         "--kafka-config", str(config), "--json")
    position = raw.index(b"\xe9")
    assert_clean_error(code, err, 2, f"kafka client config {config}: not valid UTF-8 (byte {position})")
    assert json.loads(out)["field"] == "kafka_config"
    assert "hunter2" not in out + err


def test_a_broken_kafka_config_does_not_break_a_directory_shard(tmp_path, monkeypatch, sqlite_url, capsys):
    consensus, blob = cli_store(tmp_path, monkeypatch, sqlite_url)
    make_shard(consensus, blob, tmp_path, spec=PRUNE_SPEC)
    absent = tmp_path / "absent.json"
    monkeypatch.setenv("UPSERT_KAFKA_CONFIG", str(absent))
    code, out, err = run(capsys, "status", "orders", "--no-rows", "--json")
    assert code == 0, err
    assert json.loads(out)["upper"] == 0
    code, out, err = run(capsys, "source", "prune", "orders", "--below", "committed", "--dry-run", "--json")
    assert code == 0, err
    # A Kafka shard still needs it, and says which file it could not read.
    code, _, err = run(capsys, "init", "k", "--source", "kafka:orders", "--key", "id", "--schema", "id BIGINT")
    assert_clean_error(code, err, 2, f"kafka client config {absent}: cannot read it")
    consensus.dispose()


# -- text given by someone else cannot forge a line of output -------------------------------------

def test_control_characters_of_a_reason_or_an_actor_are_escaped_in_human_output(
        tmp_path, monkeypatch, sqlite_url, capsys):
    consensus, blob = cli_store(tmp_path, monkeypatch, sqlite_url)
    make_shard(consensus, blob, tmp_path, spec=PRUNE_SPEC)
    reason = "maintenance\n2026-11-25T00:00:00+00:00  v9  resume: STOPPED -> READY (epoch 0) by ops\x1b[2K"
    code, out, err = run(capsys, "stream", "stop", "orders", "--reason", reason, "--actor", "ops\r")
    assert code == 0, err
    assert "\x1b" not in out and "\r" not in out
    assert out.splitlines()[0].endswith(": maintenance\\n2026-11-25T00:00:00+00:00  v9  resume: STOPPED -> READY "
                                        "(epoch 0) by ops\\x1b[2K")
    assert "set by ops\\r at " in out
    code, out, _ = run(capsys, "stream", "history", "orders")
    lines = out.splitlines()
    assert code == 0 and len(lines) == 3 and lines[-1] == "2 change(s)"  # stop, finalize: one line each
    assert "\x1b" not in out and "\r" not in out
    # The JSON keeps what was given, for programs.
    code, out, _ = run(capsys, "stream", "history", "orders", "--json")
    assert {(h["reason"], h["actor"]) for h in json.loads(out)["history"]} == {(reason, "ops\r")}
    consensus.dispose()


def test_an_error_message_quoting_a_file_name_stays_one_line(env, capsys, monkeypatch):
    def a_segment_named_with_a_newline(ctx, args):
        raise BadInputError(f"segment {env}/p0/1.jsonl\n: not a segment name", file=f"{env}/p0/1.jsonl\n")

    monkeypatch.setattr(Context, "__init__", lambda self, args: None)
    monkeypatch.setitem(cli.COMMANDS, "run-batch", a_segment_named_with_a_newline)
    code, out, err = run(capsys, "run-batch", "s", "--json")
    assert_clean_error(code, err, 3, f"upsertctl: segment {env}/p0/1.jsonl\\n: not a segment name\n")
    assert err.count("\n") == 1
    assert json.loads(out)["file"] == f"{env}/p0/1.jsonl\n"


def test_a_schema_that_does_not_parse_says_why(spark, env, capsys):
    code, _, err = run(capsys, "init", "s", "--source", f"dir:{env}", "--key", "id", "--schema", "garbage")
    assert_clean_error(code, err, 2, "invalid --schema 'garbage': ")
    reason = err.split("invalid --schema 'garbage': ", 1)[1].strip()
    assert reason, err


def test_a_restore_prints_its_actor_escaped(tmp_path, monkeypatch, sqlite_url, capsys):
    consensus, blob = cli_store(tmp_path, monkeypatch, sqlite_url)
    shard = make_shard(consensus, blob, tmp_path, spec=PRUNE_SPEC)
    commit(shard, 0)
    assert run(capsys, "checkpoint", "create", "orders")[0] == 0
    code, out, err = run(capsys, "checkpoint", "restore", "orders", "--as", "copy", "--actor", "ops\x1b[2K")
    assert code == 0, err
    assert "\x1b" not in out and "set by ops\\x1b[2K at " in out
    consensus.dispose()
