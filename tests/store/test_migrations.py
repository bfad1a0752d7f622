"""Schema versions of the consensus store: a store of the schema from before versions is
refused on open, upgraded by `upsertctl db upgrade`, and its shards continue; the migration
chain builds exactly the tables the code declares; a fresh store is created at the head,
also by two processes at once; a store newer than the code is refused; `db status` counts.

The schema from before versions is frozen in schema_0_sqlite.sql and schema_0_postgresql.sql
(so that the test does not build it with the code under test). They were generated once from
the tables of ``STORE_SCHEMA`` as they were when schema versions came in::

    from sqlalchemy.schema import CreateIndex, CreateTable
    from sqlalchemy.dialects import postgresql, sqlite
    from airflow_upsert_provider.engine.store.registry import STORE_SCHEMA
    for table in STORE_SCHEMA.tables:  # with sqlite.dialect(), then postgresql.dialect()
        print(f"{CreateTable(table).compile(dialect=dialect)};")
        for index in sorted(table.indexes, key=lambda i: i.name):
            print(f"{CreateIndex(index).compile(dialect=dialect)};")
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from airflow_upsert_provider.engine.errors import SchemaVersionMismatch
from airflow_upsert_provider.engine.store import migrations, registry
from airflow_upsert_provider.engine.store.tables import metadata
from airflow_upsert_provider.engine.store.urls import normalize_url
from airflow_upsert_provider.engine.store.migrations import VERSION_TABLE, code_head
from airflow_upsert_provider.engine.store.registry import STORE_SCHEMA, open_consensus
from airflow_upsert_provider.sample_data import SAMPLE_SCHEMA_DDL, SampleSpec, generate
from tests.helpers import run_cli, run_cli_json
from tests.oracle import oracle_table

HERE = Path(__file__).resolve().parent
OUR_TABLES = [t.name for t in STORE_SCHEMA.tables]
SPEC = SampleSpec(records=1200, keys=300, partitions=2, segments_per_partition=4, seed=20)


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request, tmp_path) -> str:
    """The URL of an empty store: a SQLite file or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'consensus.db'}"
    return request.getfixturevalue("pg_url")


def raw_engine(url: str) -> sa.Engine:
    """An engine of SQLAlchemy's own on the store: none of the store's code runs."""
    return sa.create_engine(normalize_url(url), poolclass=sa.pool.NullPool)


def create_legacy_store(url: str) -> None:
    """The store as the code before schema versions created it, from the frozen DDL."""
    engine = raw_engine(url)
    ddl = (HERE / f"schema_0_{engine.dialect.name}.sql").read_text()
    body = "\n".join(line for line in ddl.splitlines() if not line.startswith("--"))
    with engine.begin() as conn:
        for statement in body.split(";"):
            if statement.strip():
                conn.exec_driver_sql(statement)
    engine.dispose()


def stamp(url: str, revision: str) -> None:
    """Record ``revision`` as the store's, as another release's ``db upgrade`` would."""
    engine = raw_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql(f"UPDATE {VERSION_TABLE} SET version_num = '{revision}'")
    engine.dispose()


def dump(url: str) -> dict[str, list[tuple]]:
    """Every row of every table of the store, in a stable order."""
    engine = raw_engine(url)
    reflected = sa.MetaData()
    reflected.reflect(engine)
    with engine.connect() as conn:
        rows = {
            name: sorted(tuple(map(repr, row)) for row in conn.execute(sa.select(table)))
            for name, table in reflected.tables.items()
        }
    engine.dispose()
    return rows


def schema_differences(url: str) -> list[Any]:
    engine = raw_engine(url)
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
        differences = compare_metadata(context, metadata)
    engine.dispose()
    return differences


def revisions_of(url: str) -> list[str]:
    engine = raw_engine(url)
    with engine.connect() as conn:
        revisions = list(conn.exec_driver_sql(f"SELECT version_num FROM {VERSION_TABLE}").scalars())
    engine.dispose()
    return revisions


def init(capsys, shard: str, landing: Path) -> None:
    code, _, err = run_cli(
        capsys, "init", shard, "--source", f"dir:{landing}", "--key", "id", "--order-by", "updated_at",
        "--delete-marker", "deleted", "--max-files-per-batch", "2", "--schema", SAMPLE_SCHEMA_DDL, "--json",
    )
    assert code == 0, err


def committed(capsys, shard: str, *options: str) -> int:
    code, report, err = run_cli_json(capsys, "run-batch", shard, *options)
    assert code == 0, err
    return sum(b["outcome"] == "committed" for b in report["batches"])


def read_table(capsys, shard: str) -> dict[tuple, dict]:
    import json

    code, out, err = run_cli(capsys, "read", shard)
    assert code == 0, err
    return {(row["id"],): row for row in map(json.loads, out.splitlines())}


def test_a_store_of_the_schema_before_versions_is_refused_then_upgraded_and_its_shards_continue(
    spark, store_url, tmp_path, monkeypatch, capsys
):
    create_legacy_store(store_url)
    # The old code is emulated by this release's code, whose checkpoint snapshot reads the
    # batch rollups (revision 0002), whose checkpoint catalog is in the store (revision 0003),
    # whose compaction and status read the change retention (revision 0004) and whose catalog
    # changes drop checkpoint index rows (revision 0005): those tables exist as the old code's
    # own would have (a catalog file of the old code:
    # test_a_store_at_revision_0002_with_a_catalog_file_upgrades_and_keeps_its_checkpoints).
    from airflow_upsert_provider.engine.store.catalog_rows import catalog_entries_table, catalogs_table
    from airflow_upsert_provider.engine.store.change_feed import change_cursors_table, change_retention_table
    from airflow_upsert_provider.engine.store.checkpoint_refs import checkpoint_refs_table
    from airflow_upsert_provider.engine.store.schema_policies import schema_policies_table
    from airflow_upsert_provider.engine.store.table_schemas import table_schemas_table
    from airflow_upsert_provider.engine.store.tables import batch_rollups_table

    engine = raw_engine(store_url)
    # ... whose shards read their table schema's versions (revision 0006) and their schema
    # evolution policy (revision 0007).
    for table in (batch_rollups_table, catalogs_table, catalog_entries_table, change_retention_table,
                  change_cursors_table, checkpoint_refs_table, table_schemas_table, schema_policies_table):
        table.create(engine)
    engine.dispose()
    monkeypatch.setenv("UPSERT_CONSENSUS_URL", store_url)
    monkeypatch.setenv("UPSERT_BLOB_ROOT", str(tmp_path / "blob"))
    landing = tmp_path / "landing"
    generate(str(landing), SPEC)

    # Filled by the engine as the code before schema versions ran it: no check on open, none
    # in a commit.
    with monkeypatch.context() as old_code:
        old_code.setattr(registry, "prepare_on_open", lambda consensus, create=True: None)
        old_code.setattr(registry, "STORE_SCHEMA", dataclasses.replace(STORE_SCHEMA, commit_hooks=tuple(
            hook for hook in STORE_SCHEMA.commit_hooks if hook is not migrations.refuse_other_revision)))
        init(capsys, "orders", landing)
        init(capsys, "returns", landing)
        batches = committed(capsys, "orders", "--max-batches", "2") + committed(capsys, "returns", "--max-batches", "1")
        assert run_cli_json(capsys, "checkpoint", "create", "orders")[0] == 0
        assert run_cli_json(capsys, "compact", "orders")[0] == 0
        batches += committed(capsys, "orders", "--max-batches", "1")
        assert run_cli_json(capsys, "stream", "stop", "orders", "--drain", "0", "--reason", "upgrade")[0] == 0
        assert run_cli_json(capsys, "stream", "resume", "orders", "--reason", "upgraded")[0] == 0
        code, observed, err = run_cli_json(capsys, "frontier", "observe")
        assert code == 0, err
    before = dump(store_url)
    assert VERSION_TABLE not in before
    assert len(before["upsert_batches"]) == batches == 4 and len(before["upsert_shards"]) == 2
    assert before["upsert_compactions"] and before["upsert_stream_history"]
    # Each batch records an observation too.
    assert len(before["upsert_frontier_observations"]) == batches + len(observed["observations"]) == 6

    # Opening it now refuses, naming the command that upgrades it, and changes nothing.
    code, error, err = run_cli_json(capsys, "status", "orders", "--no-rows")
    assert code == 2 and error["error"] == "SchemaVersionMismatch"
    assert "created before schema versions" in err and "upsertctl db upgrade --conn-id" in err
    assert (error["store_revision"], error["code_revision"]) == (None, code_head())
    assert dump(store_url) == before

    code, status, err = run_cli_json(capsys, "db", "status")
    assert code == 0, err
    assert (status["store_revision"], status["code_revision"]) == (None, code_head())
    assert status["state"] == "unversioned" and status["upgrade_needed"] is True
    assert {name: t["rows"] for name, t in status["tables"].items()} == {name: len(before[name]) for name in OUR_TABLES}
    assert status["tables"]["upsert_batches"]["rows"] == 4

    code, out, err = run_cli(capsys, "db", "upgrade")
    assert code == 0, err
    assert out == f"consensus store upgraded from schema revision none (no schema version) to {code_head()}\n"
    # Idempotent.
    assert run_cli_json(capsys, "db", "upgrade")[1] == {
        "from_revision": code_head(), "to_revision": code_head(), "upgraded": False,
    }
    after = dump(store_url)
    assert after.pop(VERSION_TABLE) == [(repr(code_head()),)]
    assert after == before
    assert schema_differences(store_url) == []

    # The shards continue where they stood, to the oracle's table.
    assert committed(capsys, "orders", "--until-caught-up") > 0
    assert committed(capsys, "returns", "--until-caught-up") > 0
    expected = oracle_table(str(landing))
    assert read_table(capsys, "orders") == expected
    assert read_table(capsys, "returns") == expected
    code, listed, err = run_cli_json(capsys, "checkpoint", "list", "orders")
    assert code == 0 and len(listed["checkpoints"]) == 1, err


def test_the_migration_chain_builds_the_tables_the_code_declares(store_url):
    consensus = open_consensus(store_url, create=False, check_schema=False)
    try:
        result = migrations.upgrade(consensus)
    finally:
        consensus.dispose()
    assert (result.from_revision, result.to_revision, result.upgraded) == (None, code_head(), True)
    # A table changed without a revision shows here as a difference.
    assert schema_differences(store_url) == []
    assert revisions_of(store_url) == [code_head()]


def test_a_fresh_store_is_created_at_the_head_and_stamped(store_url):
    open_consensus(store_url).dispose()
    assert schema_differences(store_url) == []
    assert revisions_of(store_url) == [code_head()]


def test_opening_a_current_store_reads_only_the_version_row(tmp_path):
    url = f"sqlite:///{tmp_path / 'c.db'}"
    open_consensus(url).dispose()
    statements: list[str] = []
    original = registry.open_store

    def counting_open_store(url, schema):
        consensus = original(url, schema)
        sa.event.listen(consensus.engine, "before_cursor_execute",
                        lambda conn, cursor, statement, *rest: statements.append(statement))
        return consensus

    registry.open_store = counting_open_store
    try:
        open_consensus(url).dispose()
    finally:
        registry.open_store = original
    queries = [s for s in statements if not s.startswith("BEGIN")]
    assert len(queries) == 1 and VERSION_TABLE in queries[0], statements


def test_two_processes_creating_the_same_fresh_store_both_succeed(store_url, monkeypatch):
    # Both read the store as fresh before either creates it: the second to take the schema lock
    # must find the first's tables, not create them again.
    both_read = threading.Barrier(2, timeout=60)
    read_schema_state = migrations.read_schema_state

    def read_then_wait(consensus):
        state = read_schema_state(consensus)
        both_read.wait()
        return state

    monkeypatch.setattr(migrations, "read_schema_state", read_then_wait)
    outcomes: list[BaseException | str] = []

    def open_store() -> None:
        try:
            consensus = open_consensus(store_url)
            consensus.create_shard(f"s-{threading.get_ident()}", "{}")
            consensus.dispose()
            outcomes.append("ok")
        except BaseException as exc:  # reported below
            outcomes.append(exc)

    threads = [threading.Thread(target=open_store) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert outcomes == ["ok", "ok"]
    assert revisions_of(store_url) == [code_head()]
    assert len(dump(store_url)["upsert_shards"]) == 2


def test_a_store_stamped_with_a_revision_the_code_does_not_know_is_refused(store_url, tmp_path, monkeypatch, capsys):
    open_consensus(store_url).dispose()
    stamp(store_url, "9999_future")
    before = dump(store_url)

    with pytest.raises(SchemaVersionMismatch) as refused:
        open_consensus(store_url)
    message = refused.value.message
    assert f"schema revision 9999_future, which this provider (schema revision {code_head()}) does not know" in message
    assert "upgrade the provider" in message and refused.value.exit_code == 2

    monkeypatch.setenv("UPSERT_CONSENSUS_URL", store_url)
    monkeypatch.setenv("UPSERT_BLOB_ROOT", str(tmp_path / "blob"))
    code, error, err = run_cli_json(capsys, "db", "upgrade")
    assert code == 2 and error["error"] == "SchemaVersionMismatch" and "9999_future" in err
    code, status, _ = run_cli_json(capsys, "db", "status")
    assert code == 0 and status["state"] == "newer" and status["store_revision"] == "9999_future"
    assert dump(store_url) == before


def test_a_store_stamped_twice_with_revisions_the_code_knows_is_refused_as_stamped_by_hand(
    store_url, tmp_path, monkeypatch, capsys
):
    open_consensus(store_url).dispose()
    engine = raw_engine(store_url)
    with engine.begin() as conn:
        conn.execute(sa.text(f"INSERT INTO {VERSION_TABLE} (version_num) VALUES ('0002')"))
    engine.dispose()
    before = dump(store_url)

    with pytest.raises(SchemaVersionMismatch) as refused:
        open_consensus(store_url)
    message = refused.value.message
    assert f"several schema revisions stamped (0002,{code_head()})" in message
    assert "stamped by hand or by a tool" in message and "newer" not in message

    monkeypatch.setenv("UPSERT_CONSENSUS_URL", store_url)
    monkeypatch.setenv("UPSERT_BLOB_ROOT", str(tmp_path / "blob"))
    # db upgrade does not run Alembic over two heads: it refuses, and changes nothing.
    code, error, err = run_cli_json(capsys, "db", "upgrade")
    assert code == 2 and error["error"] == "SchemaVersionMismatch" and "stamped by hand" in err
    code, status, _ = run_cli_json(capsys, "db", "status")
    assert code == 0 and status["state"] == "ambiguous" and status["upgrade_needed"] is False
    assert dump(store_url) == before


def test_db_status_counts_the_rows_and_bytes_of_each_table(store_url, tmp_path, monkeypatch, capsys):
    consensus = open_consensus(store_url)
    try:
        for n in range(3):
            consensus.create_shard(f"s{n}", "{}")
    finally:
        consensus.dispose()
    monkeypatch.setenv("UPSERT_CONSENSUS_URL", store_url)
    code, status, err = run_cli_json(capsys, "db", "status")
    assert code == 0, err
    assert (status["store_revision"], status["state"], status["upgrade_needed"]) == (code_head(), "current", False)
    assert set(status["tables"]) == {*OUR_TABLES, VERSION_TABLE}
    assert status["tables"]["upsert_shards"]["rows"] == 3
    assert status["tables"][VERSION_TABLE]["rows"] == 1
    assert status["tables"]["upsert_batches"]["rows"] == 0
    # Every table takes at least a page.
    assert all(t["bytes"] > 0 for t in status["tables"].values())
    if store_url.startswith("sqlite"):
        assert status["file_bytes"] >= sum(t["bytes"] for t in status["tables"].values())
    else:
        assert status["total_bytes"] == sum(t["bytes"] for t in status["tables"].values())

    code, out, _ = run_cli(capsys, "db", "status")
    assert code == 0 and f"store schema revision: {code_head()}" in out and "upgrade needed: no" in out
    assert "  upsert_shards: 3 rows, " in out


@pytest.fixture
def code_with_a_second_revision(tmp_path, monkeypatch):
    """The migrations as a release after this one would ship them: this release's, then one
    more revision that adds a table. Yields that head's revision id."""
    import shutil

    head = code_head()
    later = f"{int(head) + 1:04d}"
    package = Path(migrations.__file__).parent
    location = tmp_path / "migrations"
    shutil.copytree(package, location, ignore=shutil.ignore_patterns("__pycache__"))
    (location / "versions" / f"{later}_extra.py").write_text(
        "import sqlalchemy as sa\n"
        "from alembic import op\n"
        f"revision = '{later}'\ndown_revision = '{head}'\nbranch_labels = None\ndepends_on = None\n"
        "def upgrade():\n"
        "    op.create_table('upsert_extra', sa.Column('shard_id', sa.String(128), primary_key=True))\n"
    )
    real_config = migrations.alembic_config

    def next_release_config(connection=None):
        config = real_config(connection)
        config.set_main_option("script_location", str(location))
        return config

    monkeypatch.setattr(migrations, "alembic_config", next_release_config)
    monkeypatch.setattr(migrations, "REVISIONS", (*migrations.REVISIONS, later))
    migrations._scripts.cache_clear()
    yield later
    migrations._scripts.cache_clear()


def test_a_store_at_an_older_revision_is_refused_until_db_upgrade_migrates_it(
    store_url, code_with_a_second_revision, monkeypatch, capsys
):
    # A store at revision 0001, as the first release with schema versions left it.
    later = code_with_a_second_revision
    create_legacy_store(store_url)
    engine = raw_engine(store_url)
    with engine.begin() as conn:
        conn.exec_driver_sql(f"CREATE TABLE {VERSION_TABLE} (version_num VARCHAR(32) NOT NULL PRIMARY KEY)")
        conn.exec_driver_sql(f"INSERT INTO {VERSION_TABLE} VALUES ('0001')")
    engine.dispose()
    consensus = open_consensus(store_url, check_schema=False)
    consensus.create_shard("orders", "{}")
    consensus.dispose()
    before = dump(store_url)

    with pytest.raises(SchemaVersionMismatch) as refused:
        open_consensus(store_url)
    assert f"has schema revision 0001, older than this provider's {later}" in refused.value.message
    assert "upsertctl db upgrade --conn-id" in refused.value.message
    assert dump(store_url) == before

    monkeypatch.setenv("UPSERT_CONSENSUS_URL", store_url)
    code, status, _ = run_cli_json(capsys, "db", "status")
    assert (status["store_revision"], status["code_revision"], status["state"]) == ("0001", later, "upgrade")
    code, upgraded, err = run_cli_json(capsys, "db", "upgrade")
    assert code == 0, err
    assert upgraded == {"from_revision": "0001", "to_revision": later, "upgraded": True}
    assert revisions_of(store_url) == [later]
    consensus = open_consensus(store_url)
    try:
        assert consensus.get_shard("orders").upper == 0
        # Every revision after 0001 ran: this release's batch rollups, the later release's table.
        assert {"upsert_batch_rollups", "upsert_extra"} <= set(sa.inspect(consensus.engine).get_table_names())
    finally:
        consensus.dispose()


def test_the_revisions_an_open_compares_with_are_the_chain_of_the_scripts():
    """An open reads no script (a submit-mode task imports the package from a zip): the chain
    it knows is written in code, and must be the one versions/ holds."""
    assert migrations.REVISIONS == migrations.script_revisions()


def test_a_fresh_store_opens_from_the_package_zipped_as_submit_mode_ships_it(tmp_path):
    from airflow_upsert_provider.operators.upsert import package_zip

    archive = package_zip(str(tmp_path))
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    probe = (
        "import sys\n"
        f"sys.path.insert(0, {archive!r})\n"
        "import airflow_upsert_provider\n"
        f"assert airflow_upsert_provider.__file__.startswith({archive!r}), airflow_upsert_provider.__file__\n"
        "from airflow_upsert_provider.engine.store.registry import open_consensus\n"
        f"open_consensus({url!r}).dispose()\n"
        f"open_consensus({url!r}).dispose()\n"
        # Creating and opening a store needs no Alembic (only db upgrade and the tests do):
        # its import cost every process a good part of a second.
        "assert 'alembic' not in sys.modules, sorted(m for m in sys.modules if m.startswith('alembic'))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                          env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, cwd=str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    assert revisions_of(url) == [migrations.code_head()]


def test_a_store_at_revision_0002_with_a_catalog_file_upgrades_and_keeps_its_checkpoints(
    spark, store_url, tmp_path, monkeypatch, capsys
):
    """Revision 0003 moves the checkpoint catalog into the store. A store at 0002 has its
    shards' catalogs as ``CATALOG.json`` files on the blob: after `db upgrade` they are listed,
    restored from and collected as before, and the first catalog change imports the file."""
    from airflow_upsert_provider.engine.blob.files import open_blob
    from airflow_upsert_provider.engine.maintenance.checkpoint_catalog import (
        CATALOG_NAME,
        checkpoints_root,
        copy_name,
    )
    from tests.maintenance.support import as_legacy_catalog, catalog_copies

    monkeypatch.setenv("UPSERT_CONSENSUS_URL", store_url)
    monkeypatch.setenv("UPSERT_BLOB_ROOT", str(tmp_path / "blob"))
    landing = tmp_path / "landing"
    generate(str(landing), SPEC)
    init(capsys, "orders", landing)
    committed(capsys, "orders", "--max-batches", "2")
    code, created, err = run_cli_json(capsys, "checkpoint", "create", "orders")
    assert code == 0, err
    first = created["checkpoint"]
    # As revision 0002 left it: the catalog in CATALOG.json only, no catalog tables.
    blob = open_blob(str(tmp_path / "blob"))
    consensus = open_consensus(store_url)
    as_legacy_catalog(consensus, blob, "orders")
    consensus.dispose()
    engine = raw_engine(store_url)
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP TABLE upsert_checkpoint_entries")
        conn.exec_driver_sql("DROP TABLE upsert_checkpoint_catalogs")
        conn.exec_driver_sql(f"UPDATE {VERSION_TABLE} SET version_num = '0002'")
    engine.dispose()

    code, error, err = run_cli_json(capsys, "checkpoint", "list", "orders")
    assert code == 2 and error["error"] == "SchemaVersionMismatch" and "revision 0002, older" in err
    code, upgraded, err = run_cli_json(capsys, "db", "upgrade")
    assert code == 0, err
    assert upgraded == {"from_revision": "0002", "to_revision": code_head(), "upgraded": True}
    assert schema_differences(store_url) == []

    # Listed from the file until the store imports it; GC keeps what it lists.
    code, listed, err = run_cli_json(capsys, "checkpoint", "list", "orders")
    assert code == 0, err
    assert [c["id"] for c in listed["checkpoints"]] == [first["id"]]
    assert run_cli_json(capsys, "gc", "orders", "--grace", "0")[0] == 0
    assert run_cli_json(capsys, "checkpoint", "verify", "orders", first["id"])[0] == 0

    # The next checkpoint imports the file into the store: both listed, the file superseded
    # by the store's blob copy.
    committed(capsys, "orders", "--max-batches", "1")
    code, created, err = run_cli_json(capsys, "checkpoint", "create", "orders")
    assert code == 0, err
    second = created["checkpoint"]
    code, listed, err = run_cli_json(capsys, "checkpoint", "list", "orders")
    assert [c["id"] for c in listed["checkpoints"]] == [first["id"], second["id"]]
    assert dump(store_url)["upsert_checkpoint_entries"] and len(dump(store_url)["upsert_checkpoint_entries"]) == 2
    assert CATALOG_NAME not in blob.listdir(checkpoints_root(blob, "orders"))
    assert catalog_copies(blob, "orders") == [copy_name(2)]
    # And the checkpoint from before the upgrade restores, to the table as it was then.
    code, restored, err = run_cli_json(capsys, "checkpoint", "restore", "orders", first["id"], "--as", "orders-then")
    assert code == 0, err
    assert (restored["shard"], restored["upper"]) == ("orders-then", first["upper"])


@pytest.mark.parametrize("revision", ["0007", "9999_future", "0002"])
def test_a_commit_after_the_store_was_upgraded_underneath_is_refused_and_nothing_is_committed(store_url, revision):
    from airflow_upsert_provider.engine.store.records import BatchRecord

    def batch(ts: int) -> BatchRecord:
        return BatchRecord(ts=ts, writer_id="w", token=f"t{ts}", run={"path": f"s/runs/{ts}", "files": []}, stats={})

    consensus = open_consensus(store_url)  # opened (and checked) while the store is at the head
    try:
        consensus.create_shard("s", "{}")
        assert consensus.compare_and_append("s", 0, 1, batch(0)).upper == 1
        # `db upgrade` by another release (or any other change of the revision) runs underneath.
        stamp(store_url, revision)
        before = dump(store_url)

        with pytest.raises(SchemaVersionMismatch) as refused:
            consensus.compare_and_append("s", 1, 2, batch(1))
        message = refused.value.message
        assert message.startswith("commit of batch 1 of shard 's' refused: the schema changed after this process "
                                  "opened the store")
        assert f"schema revision {revision}" in message and refused.value.exit_code == 2
        assert refused.value.details["store_revision"] == revision
        assert refused.value.details["code_revision"] == code_head()
        with pytest.raises(SchemaVersionMismatch, match="compaction to since 1 of shard 's' refused"):
            consensus.compare_and_set_since("s", 0, 1, {"path": "s/runs/c", "files": []})
        assert dump(store_url) == before
        assert (consensus.get_shard("s").upper, consensus.get_shard("s").since) == (1, 0)
    finally:
        consensus.dispose()
