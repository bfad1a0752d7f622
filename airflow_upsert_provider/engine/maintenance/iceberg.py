"""Publishing a shard's table as an Apache Iceberg snapshot, through PyIceberg.

``publish_iceberg`` writes the table as of the shard's ``since`` (the state the last
compaction fixed) as ONE new snapshot of an Iceberg table: an overwrite of the buckets whose
live runs changed since the last publish, keeping the other buckets' data files
(:mod:`iceberg_buckets`), whose summary carries ``upsert.shard``, ``upsert.since``,
``upsert.upper`` and ``upsert.buckets``. After it, snapshots beyond a retention are expired
with the files only they used (:mod:`iceberg_expiry`). Any engine
that reads Iceberg (Spark, Trino, DuckDB, Snowflake, PyIceberg) reads it, and time travel
to an earlier snapshot gives the table as of an earlier compaction.

What to do is a pure function of the shard's since and the table's current snapshot summary
(:func:`decide_publish`): publish, nothing to publish (that since is the table's already), or
refuse (the table is ahead of the shard, or was written by something else). The effects are
a thin shell around it.

Files: the publish writes its own Parquet files, under the Iceberg table's location (by
default ``<blob root>/_iceberg/<namespace>/<table>/``), from the table read without Spark
(``arrow_reader``), or merged and written by Spark's executors (:mod:`iceberg_spark`). It never registers the shard's run files: a read merges several runs per
bucket (latest row per key, tombstones removed), so no run file is the table, and GC deletes
run files once a compaction replaced them. The published files are outside every shard's
directories (``<shard>/runs``, ``<shard>/checkpoints``, ``<shard>/rejects``), the only places
GC lists, so GC never deletes a file a snapshot references.

Atomicity: the data files and the manifests are written first, then the catalog's commit
swaps the table's metadata pointer (a conditional UPDATE in the SQL catalog; the REST
catalog's commit). A failed read or write or a lost race deletes the files it wrote (nothing
references them); a crash before the commit leaves files no snapshot references (PyIceberg
does not delete them; an orphan-file removal of the Iceberg table, e.g. Spark's
``remove_orphan_files`` procedure, does). Never a partial snapshot.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from airflow_upsert_provider.engine.common.retry import CAS_CONTENTION
from airflow_upsert_provider.engine.config import ShardConfig
from airflow_upsert_provider.engine.errors import (
    ConfigurationError,
    IntegrityError,
    OutcomeUnknown,
    SchemaChangeRefused,
    UpsertError,
    first_line,
)
from airflow_upsert_provider.engine.maintenance.iceberg_buckets import (
    SUMMARY_BUCKETS,
    bucket_digests,
    bucket_files,
    plan_buckets,
    published_digests,
    summary_digests,
    task_id,
)
from airflow_upsert_provider.engine.maintenance.iceberg_catalog import (
    catalog_properties,
    catalog_unavailable,
    close_catalog,
    describe_catalog,
    open_catalog,
)
from airflow_upsert_provider.engine.maintenance.iceberg_expiry import ExpiryResult, Retention, expire_snapshots
from airflow_upsert_provider.engine.maintenance.iceberg_names import parse_table_identifier
from airflow_upsert_provider.engine.maintenance.iceberg_schema import ColumnUpdate, iceberg_schema, schema_updates
from airflow_upsert_provider.engine.table.arrow_reader import read_runs_arrow
from airflow_upsert_provider.engine.table.runs import read_group_count
from airflow_upsert_provider.engine.table.shard import Shard

if TYPE_CHECKING:
    import pyarrow
    from pyiceberg.catalog import Catalog
    from pyiceberg.schema import Schema
    from pyiceberg.table import Table
    from pyspark.sql import SparkSession

# Keys of the snapshot summary a publish writes.
SUMMARY_SHARD = "upsert.shard"
SUMMARY_SINCE = "upsert.since"
SUMMARY_UPPER = "upsert.upper"
# The shard's table schema version whose columns the snapshot holds.
SUMMARY_SCHEMA_VERSION = "upsert.schema_version"

PUBLISHED = "published"
NOTHING_TO_PUBLISH = "nothing_to_publish"
# Decisions of decide_publish.
PUBLISH = "publish"
NOTHING = "nothing"
REFUSE = "refuse"

# The table property PyIceberg sizes data files by, and what a table a publish creates gets:
# 128 MiB of Arrow data (files a few times smaller once compressed), which is also about the
# most a publish holds at once beside the reader's bucket (PyIceberg's default is 512 MiB).
TARGET_FILE_SIZE_PROPERTY = "write.target-file-size-bytes"
DEFAULT_TARGET_FILE_BYTES = 128 * 1024 * 1024
# PyIceberg's table property for how often it retries a commit by itself (off for a publish).
COMMIT_RETRIES_PROPERTY = "commit.retry.num-retries"
# A lost commit race means another publish committed first; a few rounds settle it.
MAX_ATTEMPTS = CAS_CONTENTION.max_attempts

# -- pure ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PublishDecision:
    """What a publish does: ``action`` is PUBLISH, NOTHING or REFUSE; ``reason`` says why
    (the refusal's message for REFUSE)."""

    action: str
    reason: str


def decide_publish(
    shard_id: str,
    since: int,
    table: str,
    snapshot_id: int | None,
    summary: Mapping[str, str] | None,
) -> PublishDecision:
    """What publishing shard ``shard_id`` as of ``since`` to the Iceberg table ``table``
    does, given the table's current snapshot (``snapshot_id`` and its ``summary``; None for
    a table that does not exist yet or has no snapshot). Pure.

    - no snapshot: publish (nothing before since 0: nothing to publish);
    - a snapshot another publish of this shard wrote at the same since: nothing to publish;
    - at a lower since: publish;
    - at a higher since (the shard was restored from an older checkpoint, or the table is
      another store's), or written by another shard or by another writer: refuse, since an
      overwrite would destroy what the table holds."""
    if snapshot_id is None or summary is None:
        if since == 0:
            return PublishDecision(NOTHING, f"shard {shard_id!r} has no compaction yet, since 0")
        return PublishDecision(PUBLISH, f"table {table} has no snapshot")
    published_by = summary.get(SUMMARY_SHARD)
    if published_by is None:
        return PublishDecision(
            REFUSE,
            f"Iceberg table {table}: its current snapshot {snapshot_id} was not written by a publish of this "
            f"provider (no {SUMMARY_SHARD} in its summary); publishing shard {shard_id!r} would overwrite it: "
            "publish to another table",
        )
    if published_by != shard_id:
        return PublishDecision(
            REFUSE,
            f"Iceberg table {table}: its current snapshot {snapshot_id} was published from shard "
            f"{published_by!r}, not {shard_id!r}: publish each shard to its own table",
        )
    try:
        published_since = int(summary.get(SUMMARY_SINCE, ""))
    except ValueError:
        return PublishDecision(
            REFUSE,
            f"Iceberg table {table}: its current snapshot {snapshot_id} has no integer {SUMMARY_SINCE} "
            f"({summary.get(SUMMARY_SINCE)!r}) in its summary",
        )
    if published_since == since:
        return PublishDecision(NOTHING, f"since {since} already published: snapshot {snapshot_id}")
    if published_since > since:
        return PublishDecision(
            REFUSE,
            f"Iceberg table {table} is ahead of shard {shard_id!r}: its current snapshot {snapshot_id} holds "
            f"since {published_since}, the shard's since is {since} (was the shard restored from an older "
            "checkpoint?); publish to a new table, or drop this one, to publish the shard's state",
        )
    return PublishDecision(PUBLISH, f"table {table} holds since {published_since}, the shard's since is {since}")


def decide_on_table(shard_id: str, since: int, table_name: str, table: "Table | None") -> PublishDecision:
    """:func:`decide_publish` on ``table`` as loaded (None: no such table): its current
    snapshot's id and summary. No I/O: the loaded metadata holds both."""
    snapshot = table.current_snapshot() if table is not None else None
    if snapshot is None:
        return decide_publish(shard_id, since, table_name, None, None)
    return decide_publish(shard_id, since, table_name, snapshot.snapshot_id, _current_summary(table))


def _current_summary(table: "Table") -> dict[str, str]:
    """The current snapshot's summary properties ({} for none, or a snapshot without a
    summary: never None, which means no snapshot)."""
    snapshot = table.current_snapshot()
    if snapshot is None or snapshot.summary is None:
        return {}
    return dict(snapshot.summary.additional_properties)


# -- effects ---------------------------------------------------------------------------------


@dataclass
class PublishResult:
    shard: str
    table: str
    outcome: str
    since: int
    upper: int
    snapshot_id: int | None = None
    rows: int = 0
    files: int = 0
    bytes: int = 0
    attempts: int = 0
    seconds: float = 0.0
    reason: str = ""
    # Buckets whose data files were written again, and kept from the previous snapshot.
    buckets_rewritten: int = 0
    buckets_kept: int = 0
    # Snapshot expiry after the publish (iceberg_expiry): snapshots removed, files deleted.
    expired: int = 0
    deleted_files: int = 0

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["seconds"] = round(self.seconds, 3)
        return data


def publish_to_catalog(
    shard: Shard, table_identifier: str, *, consensus_url: str, blob_root: str, catalog_uri: str | None = None,
    properties: Mapping[str, str] | None = None, retention: Retention | None = Retention(),
    spark: "SparkSession | None" = None,
) -> PublishResult:
    """:func:`publish_iceberg` through the catalog of ``properties`` (an Iceberg catalog
    connection's: :func:`connection_catalog_properties`), else the one :func:`catalog_properties`
    gives for the shard's store URL, blob root and ``catalog_uri``; opened for this publish
    and closed after; ``retention`` and ``spark`` as :func:`publish_iceberg` takes them."""
    parse_table_identifier(table_identifier)  # a usage error before the catalog is opened
    if properties is None:
        properties = catalog_properties(consensus_url, blob_root, catalog_uri)
    catalog = open_catalog(properties)
    try:
        return publish_iceberg(shard, catalog, table_identifier, catalog_name=describe_catalog(properties),
                               retention=retention, spark=spark)
    finally:
        close_catalog(catalog)


def publish_iceberg(
    shard: Shard,
    catalog: "Catalog",
    table_identifier: str,
    *,
    max_attempts: int = MAX_ATTEMPTS,
    catalog_name: str | None = None,
    on_step: Callable[[str], None] | None = None,
    retention: Retention | None = Retention(),
    spark: "SparkSession | None" = None,
) -> PublishResult:
    """Publish ``shard``'s table as of its since to the Iceberg table ``table_identifier``
    (``NAMESPACE.TABLE``) of ``catalog``, as one snapshot (module docstring). Idempotent:
    the same since again publishes nothing. The namespace and the table are created on the
    first publish, with the shard's schema (:func:`iceberg_schema`); an existing table of
    another schema is a :class:`ConfigurationError` naming the table and the field, and
    nothing is published.

    :param catalog_name: how errors name the catalog (no secret), e.g. :func:`describe_catalog`.
    :param on_step: called with ``"create"`` before a publish that found no table creates
        it, and with ``"written"`` once the data files and manifests are written, before the
        catalog's commit (tests force races and crashes there); then as
        :func:`iceberg_expiry.expire_snapshots` calls it.
    :param spark: a session whose executors merge and write the data files
        (:mod:`iceberg_spark`; on a filesystem path they reach or on object storage, with
        their own credentials); None: the Arrow reader and PyIceberg's writer, in this process.
    :param retention: the snapshots kept after the publish (also after one with nothing to
        publish: it finishes an interrupted expiry); the older ones and the files only they
        referenced are deleted (:mod:`iceberg_expiry`). None: no expiry.
    """
    started = time.monotonic()
    identifier = parse_table_identifier(table_identifier)
    table_name = ".".join(identifier)
    where = catalog_name or "the Iceberg catalog"
    step = on_step or (lambda _name: None)
    for attempt in range(1, max_attempts + 1):
        # Since and the runs a read as of it merges, from one snapshot of consensus; a
        # compaction between the two reads moves since: read again.
        since = shard.state().since
        view = shard.consensus.live_view(shard.shard_id, since)
        if view.record.since != since:
            continue
        table = _load_table(catalog, identifier, where)
        decision = decide_on_table(shard.shard_id, since, table_name, table)
        # The columns a read as of since returns: the handle's schema version, or a newer one
        # a live run was written with (Shard.config_for_runs).
        config = shard.config_for_runs(view.runs)
        if decision.action == PUBLISH and table is None:
            step("create")
            table = _create_table(catalog, identifier, iceberg_schema(config), where)
            # A peer may have created the table first, and published to it already: what
            # create-if-not-exists loaded is decided on again, never committed over.
            decision = decide_on_table(shard.shard_id, since, table_name, table)
        base = dict(shard=shard.shard_id, table=table_name, since=since, upper=view.record.upper, attempts=attempt)
        if decision.action == REFUSE:
            raise ConfigurationError(decision.reason, shard=shard.shard_id, table=table_name, field="iceberg")
        if decision.action == NOTHING:
            snapshot = table.current_snapshot() if table is not None else None
            expiry = _expire(table, retention, step, where) if snapshot is not None else None
            return PublishResult(outcome=NOTHING_TO_PUBLISH, snapshot_id=snapshot.snapshot_id if snapshot else None,
                                 seconds=time.monotonic() - started, reason=decision.reason, **base,
                                 **_expiry_counts(expiry))
        # A schema version the table does not have yet becomes an Iceberg schema update in
        # the snapshot's own commit; a change Iceberg cannot make commits nothing.
        try:
            updates = schema_updates(iceberg_schema(config), table.schema(), table_name)
        except SchemaChangeRefused as refused:
            raise SchemaChangeRefused(f"{refused.message}: nothing was published", shard=shard.shard_id,
                                      field="schema", **refused.details) from None
        summary_properties = {
            SUMMARY_SHARD: shard.shard_id,
            SUMMARY_SINCE: str(since),
            SUMMARY_UPPER: str(view.record.upper),
            SUMMARY_SCHEMA_VERSION: str(config.schema_version),
        }
        # Buckets whose live run files are the ones the current snapshot was written from
        # keep their data files (iceberg_buckets); the others are read and written again.
        groups = read_group_count(shard.config, view.runs)
        by_bucket = bucket_files([f for run in view.runs for f in run["files"]], groups)
        digests = bucket_digests(by_bucket, groups)
        current = list(current_data_files(table))
        plan = plan_buckets(digests, published_digests(_current_summary(table)), [f.file_path for f in current])
        summary_properties[SUMMARY_BUCKETS] = summary_digests(digests)
        removed = [f for f in current if f.file_path in set(plan.delete)]
        if spark is None:
            write_data = _arrow_data_files(shard, config, by_bucket, plan.rewrite)
        else:
            write_data = _spark_data_files(spark, shard, config, by_bucket, plan.rewrite, groups)
        committed = _commit_overwrite(table, write_data, removed, summary_properties, shard.shard_id, since, table_name,
                                      where, step, updates)
        if committed is None:
            continue  # another commit landed first: decide again on the table it left
        snapshot, added = committed
        expiry = _expire(table, retention, step, where)
        return PublishResult(
            outcome=PUBLISHED,
            snapshot_id=snapshot.snapshot_id,
            rows=sum(f.record_count for f in added),
            files=len(added),
            bytes=sum(f.file_size_in_bytes for f in added),
            buckets_rewritten=len(plan.rewrite),
            buckets_kept=len(digests) - len(plan.rewrite),
            seconds=time.monotonic() - started,
            reason=decision.reason,
            **base,
            **_expiry_counts(expiry),
        )
    raise UpsertError(
        f"publishing shard {shard.shard_id!r} to Iceberg table {table_name} lost the race {max_attempts} times; "
        "another publish or compaction keeps moving",
        shard=shard.shard_id,
        table=table_name,
    )


def _expire(
    table: "Table", retention: Retention | None, step: Callable[[str], None], where: str
) -> ExpiryResult | None:
    """Snapshot expiry after a publish (None: not asked for), on the table as the catalog has
    it now. A failure is the store's or the catalog's error; what the publish committed stays."""
    if retention is None:
        return None
    try:
        return expire_snapshots(table.refresh(), retention, now_ms=int(time.time() * 1000), on_step=step)
    except UpsertError:
        raise
    except Exception as exc:
        mapped = store_error(table.location(), exc, "delete")
        raise mapped or catalog_unavailable(where, exc) from None


def _expiry_counts(expiry: ExpiryResult | None) -> dict[str, int]:
    if expiry is None:
        return {}
    return {"expired": len(expiry.expired), "deleted_files": sum(expiry.deleted.values())}


def _load_table(catalog: "Catalog", identifier: tuple[str, ...], where: str) -> "Table | None":
    from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError
    from pyiceberg.exceptions import ValidationError as MetadataInvalid

    try:
        return catalog.load_table(identifier)
    except (NoSuchTableError, NoSuchNamespaceError):
        return None
    except UpsertError:
        raise
    except (MetadataInvalid, ValueError, FileNotFoundError) as exc:
        # The catalog answered and named a metadata file that does not parse (or is gone):
        # every retry would fail the same way.
        raise _damaged_metadata(catalog, identifier, where, exc) from None
    except Exception as exc:
        # Reading the metadata file from an object store can fail as the blob's requests do.
        location = _metadata_location(catalog, identifier)
        mapped = store_error(location, exc, "read") if location else None
        raise mapped or catalog_unavailable(where, exc) from None


def _metadata_location(catalog: "Catalog", identifier: tuple[str, ...]) -> str | None:
    """The metadata file a SQL catalog names for the table; None for another catalog (a
    REST catalog reads its metadata itself) or when the catalog cannot say."""
    from pyiceberg.catalog.sql import IcebergTables, SqlCatalog
    from sqlalchemy import select
    from sqlalchemy.orm import Session

    if not isinstance(catalog, SqlCatalog):
        return None
    try:
        with Session(catalog.engine) as session:
            return session.scalar(select(IcebergTables.metadata_location).where(
                IcebergTables.catalog_name == catalog.name,
                IcebergTables.table_namespace == ".".join(identifier[:-1]),
                IcebergTables.table_name == identifier[-1],
            ))
    except Exception:  # the error in hand is reported; the file's name is a bonus
        return None


def _damaged_metadata(catalog: "Catalog", identifier: tuple[str, ...], where: str, exc: BaseException) -> UpsertError:
    """The integrity error of a table whose metadata file (the one the SQL catalog names)
    does not parse or is gone; the catalog's failure as it is when no file is named (a REST
    catalog reads the metadata itself: its failure says nothing of a file here)."""
    table_name = ".".join(identifier)
    location = _metadata_location(catalog, identifier)
    if location is None:
        return catalog_unavailable(where, exc)
    what = "is missing" if isinstance(exc, FileNotFoundError) else "does not parse"
    return IntegrityError(
        f"Iceberg table {table_name} in {where}: its metadata file {location} {what} "
        f"({type(exc).__name__}: {first_line(exc)[:200]}); "
        "nothing was published: restore the file, or point the table at an intact metadata file (or drop it), "
        "then publish again",
        table=table_name,
        file=location,
    )


def store_error(location: str, exc: BaseException, operation: str) -> UpsertError | None:
    """The engine error a request PyIceberg's file IO made below ``location`` (a table's or
    a metadata file's URI on object storage) stands for, as the blob root's own requests
    raise it (:class:`BlobUnavailable` for a transient failure); None for a local location
    or a failure of no kind the store explains."""
    from airflow_upsert_provider.engine.blob.filesystems import split_uri
    from airflow_upsert_provider.engine.blob.objects import request_error

    if not isinstance(exc, OSError):
        return None
    try:
        if not split_uri(location)[0]:
            return None
    except ConfigurationError:
        return None
    return request_error(location, exc, operation, location)


def _create_table(catalog: "Catalog", identifier: tuple[str, ...], schema: "Schema", where: str) -> "Table":
    try:
        catalog.create_namespace_if_not_exists(identifier[:-1])
        # A peer creating it at the same time is fine: the table it created is loaded.
        return catalog.create_table_if_not_exists(
            identifier, schema=schema, properties={TARGET_FILE_SIZE_PROPERTY: str(DEFAULT_TARGET_FILE_BYTES)}
        )
    except UpsertError:
        raise
    except Exception as exc:
        raise catalog_unavailable(where, exc) from None


def target_file_bytes(properties: Mapping[str, str]) -> int:
    """The Arrow bytes of one data file (the table's ``write.target-file-size-bytes``, which
    PyIceberg measures in memory, before compression): also the most rows a publish holds."""
    text = properties.get(TARGET_FILE_SIZE_PROPERTY)
    try:
        value = int(text) if text is not None else DEFAULT_TARGET_FILE_BYTES
    except ValueError:
        value = DEFAULT_TARGET_FILE_BYTES
    return max(value, 1)


def arrow_chunks(reader: "pyarrow.RecordBatchReader", target_bytes: int) -> Iterator["pyarrow.Table"]:
    """``reader``'s record batches gathered into tables of about ``target_bytes`` (the last
    smaller); none for an empty reader. Pure."""
    import pyarrow as pa

    held: list[Any] = []
    size = 0
    for batch in reader:
        if batch.num_rows == 0:
            continue
        held.append(batch)
        size += batch.nbytes
        if size >= target_bytes:
            yield pa.Table.from_batches(held, schema=reader.schema)
            held, size = [], 0
    if held:
        yield pa.Table.from_batches(held, schema=reader.schema)


def current_data_files(table: "Table") -> Iterator[Any]:
    """The data files of the table's current snapshot (what an overwrite replaces)."""
    from pyiceberg.manifest import DataFileContent

    snapshot = table.current_snapshot()
    if snapshot is None:
        return
    for manifest in snapshot.manifests(table.io):
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            if entry.data_file.content == DataFileContent.DATA:
                yield entry.data_file


# How a publish writes its data files: given the table, the transaction and the attempt's
# commit uuid (in every file's name), the data files written, as they are written.
DataFileWriter = Callable[["Table", Any, Any], Iterator[Any]]


def _arrow_data_files(shard: Shard, config: ShardConfig, by_bucket: dict[str, list[dict[str, Any]]],
                      rewrite: tuple[str, ...]) -> DataFileWriter:
    """The ``rewrite`` buckets read by the Arrow reader (with ``config``'s columns) and written
    by PyIceberg here."""
    from pyiceberg.io.pyarrow import bin_pack_arrow_table, pyarrow_to_schema, write_file
    from pyiceberg.table import WriteTask

    def write(table: "Table", transaction: Any, commit_uuid: Any) -> Iterator[Any]:
        target_bytes = target_file_bytes(transaction.table_metadata.properties)
        for bucket in rewrite:
            reader = read_runs_arrow(config, shard.blob, [{"files": by_bucket[bucket]}], shard_id=shard.shard_id)
            # One counter per bucket: the bucket is in each file's name (its task id).
            counter = itertools.count(0)
            # Chunk by chunk: write_file hands every task of one call to a thread pool at
            # once, so one call per chunk is what bounds the rows held to one chunk.
            for chunk in arrow_chunks(reader, target_bytes):
                metadata = transaction.table_metadata
                schema = pyarrow_to_schema(chunk.schema, name_mapping=metadata.schema().name_mapping,
                                           format_version=metadata.format_version)
                tasks = (WriteTask(write_uuid=commit_uuid, task_id=task_id(bucket, next(counter)),
                                   record_batches=batches, schema=schema)
                         for batches in bin_pack_arrow_table(chunk, target_bytes))
                yield from write_file(io=table.io, table_metadata=metadata, tasks=tasks)

    return write


def _spark_data_files(spark: "SparkSession", shard: Shard, config: ShardConfig,
                      by_bucket: dict[str, list[dict[str, Any]]], rewrite: tuple[str, ...], group_count: int
                      ) -> DataFileWriter:
    """The ``rewrite`` buckets (of ``group_count``) merged with ``config``'s columns and written
    by Spark's executors (:mod:`iceberg_spark`) in the schema of the transaction's table;
    each file's entry from its footer, read here once the store's size of it is checked.
    Files a failed attempt's executors wrote are deleted (the driver may not know them all)."""
    from airflow_upsert_provider.engine.maintenance import iceberg_spark

    def write(table: "Table", transaction: Any, commit_uuid: Any) -> Iterator[Any]:
        iceberg_spark.data_location(table)  # a location executors cannot reach: refused before anything is written
        try:
            written = iceberg_spark.write_on_executors(
                spark, shard, table, by_bucket, rewrite, target_file_bytes(transaction.table_metadata.properties),
                group_count, write_uuid=str(commit_uuid), config=config,
                schema=transaction.table_metadata.schema())
            yield from iceberg_spark.data_files_of(table, transaction.table_metadata, written)
        except BaseException:
            iceberg_spark.remove_attempt(table, str(commit_uuid))
            raise

    return write


def _commit_overwrite(
    table: "Table", write_data: DataFileWriter, removed: list[Any],
    summary: dict[str, str], shard_id: str, since: int, table_name: str, where: str,
    on_step: Callable[[str], None], schema_changes: tuple[ColumnUpdate, ...] = (),
) -> "tuple[Any, list[Any]] | None":
    """Write the data files (``write_data``) of ``table``'s new snapshot and commit it as ONE
    snapshot that removes the ``removed`` data files of the current one and keeps its others
    (an OVERWRITE; an APPEND on a table without a snapshot), its summary carrying
    ``summary``; ``schema_changes`` update the table's schema first, in the same commit (the
    data files are written in the updated schema). The commit requires the table's current snapshot to be the one this
    started from: None when another commit landed first (the files written are then
    referenced by nothing). Returns the new snapshot and the files it added."""
    from pyiceberg.exceptions import CommitFailedException, ValidationException

    # The public overwrite() commits a DELETE and an APPEND snapshot; one snapshot per
    # publish feeds the transaction's snapshot producer with the files written.
    transaction = _without_commit_retries(table).transaction()
    added: list[Any] = []
    try:
        if schema_changes:
            with transaction.update_schema() as update:
                apply_schema_updates(update, schema_changes)
        with transaction.update_snapshot(snapshot_properties=summary).overwrite() as overwrite:
            for data_file in removed:
                overwrite.delete_data_file(data_file)
            for data_file in write_data(table, transaction, overwrite.commit_uuid):
                overwrite.append_data_file(data_file)
                added.append(data_file)
            snapshot_id = overwrite.snapshot_id
    except BaseException as exc:
        # A read or write failed (a damaged run file, a full disk, the store): nothing was committed.
        _delete_files(table, added)
        mapped = store_error(f"{table.location().rstrip('/')}/data", exc, "write")
        if mapped is not None:
            raise mapped from None
        raise
    on_step("written")
    try:
        committed = transaction.commit_transaction()
    except (CommitFailedException, ValidationException):
        # Provably not committed (the table moved since this publish read it): no snapshot
        # can reference these files (PyIceberg removed the attempt's manifests itself).
        _delete_files(table, added)
        return None
    except UpsertError:
        raise
    except Exception as exc:
        raise OutcomeUnknown(
            f"publishing shard {shard_id!r} at since {since} to Iceberg table {table_name} has an unknown "
            f"outcome ({where}: {type(exc).__name__}: {first_line(exc)}); run it again: a publish of the same "
            "since adds nothing if this one landed",
            shard=shard_id,
            table=table_name,
        ) from None
    return committed.snapshot_by_id(snapshot_id), added


def apply_schema_updates(update: Any, changes: Iterable[ColumnUpdate]) -> None:
    """Stage ``changes`` on PyIceberg's ``UpdateSchema`` ``update``: an added column is
    optional with a new field id (a nested type's ids assigned anew), a widened one keeps its
    field id."""
    for change in changes:
        if change.old_type is None:
            update.add_column(change.path, change.new_type, required=False)
        else:
            update.update_column(change.path, field_type=change.new_type)


def _delete_files(table: "Table", data_files: list[Any]) -> None:
    """Delete the data files of a publish that provably committed nothing; one that cannot be
    deleted is left for an orphan-file removal (no snapshot references it)."""
    for data_file in data_files:
        try:
            table.io.delete(data_file.file_path)
        except Exception:
            pass


def _without_commit_retries(table: "Table") -> "Table":
    """``table`` as this process sees it, with PyIceberg's own commit retries off. Its retry
    rebases a commit onto a table another commit moved, which would put this since's snapshot
    over whatever the other commit published (a later since, even); the publish decides
    again instead. Nothing of it is written to the table: the property changes only the copy
    of the metadata in memory, and the catalog applies the commit's updates to its own."""
    from pyiceberg.table import Table

    properties = {**table.metadata.properties, COMMIT_RETRIES_PROPERTY: "0"}
    metadata = table.metadata.model_copy(update={"properties": properties})
    return Table(table.name(), metadata=metadata, metadata_location=table.metadata_location, io=table.io,
                 catalog=table.catalog)


