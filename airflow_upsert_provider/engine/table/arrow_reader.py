"""The shard's table without Spark: the live runs merged with pyarrow, bucket by bucket.

The table is the one :meth:`Shard.read` returns (``runs.read_runs``): per key the row with the
highest order value wins, then the highest ``_ts``; a null order value ranks below every
value and NaN above every number (Spark's ordering); without an order column the highest
``_ts`` wins; tombstones are removed and only the user columns come out, keys first.

Memory: every run is split by the hash of the key into the same buckets
(``<run>/_bucket=<n>/part-*.parquet``), so a key's rows are all in one bucket of every run,
and each bucket is merged alone, as a stream: a k-way merge over the bucket's sorted run
files that holds one record batch per file (:func:`merge_sorted_streams`), plus one output
batch of at most ``batch_rows`` rows: memory follows the number of runs, not the size of a
bucket. Shards with floating-point keys (Spark and Arrow order NaN differently) and runs whose
files are not laid out by bucket (none the engine writes) are merged a whole bucket at a time.
When the shard's bucket count grew (a compaction with ``--buckets``), runs written with the
old count and with the new one are merged by the old count's buckets (each one the union of
the new buckets it split into) until a compaction has rewritten every old-count run.

Files are read through the blob's filesystem (local disk or object storage) with the same
reader the executors use (:func:`run_io.read_files`). Nothing is checked
before reading (no request per file): a read that fails explains itself afterwards
(``Shard.reading``): a listed file that is missing, or not what the shard's state recorded
(size, SHA-256, Parquet footer), is an :class:`IntegrityError` naming it, one that GC removed
after a compaction replaced it is the retryable :class:`ReadOutdated`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from airflow_upsert_provider.engine.blob.interface import Blob
from airflow_upsert_provider.engine.config import ShardConfig
from airflow_upsert_provider.engine.errors import ConfigurationError, IntegrityError, UpsertError, first_line
from airflow_upsert_provider.engine.table import run_io
from airflow_upsert_provider.engine.table.runs import (
    file_problem,
    order_column,
    read_group_count,
    run_schema,
    table_columns,
)

if TYPE_CHECKING:
    import pyarrow

    from airflow_upsert_provider.engine.table.shard import Shard

# Rows per output batch: one batch is what a consumer holds beside the merged bucket.
BATCH_ROWS = 65_536
# The bucket directory of a run file, as both run writers name it.
_BUCKET_DIR = re.compile(r"(?:^|/)_bucket=(\d+)/[^/]+$")

# What reads one run file: (blob root, its listing {path relative to the root, bytes, ...},
# schema) -> its record batches.
FileReader = Callable[[str, dict[str, Any], "pyarrow.Schema"], Iterator["pyarrow.RecordBatch"]]


def read_table(
    shard: "Shard",
    as_of: int | None = None,
    columns: Sequence[str] | None = None,
    filter: "pyarrow.compute.Expression | None" = None,  # noqa: A002 (the name pyarrow's datasets use)
    *,
    batch_rows: int = BATCH_ROWS,
) -> "pyarrow.RecordBatchReader":
    """The table of ``shard`` as of ``as_of`` (default: the upper), as Arrow record batches,
    read without Spark: the same rows as :meth:`Shard.read`, bucket after bucket, sorted by
    key within a bucket (not across buckets).

    :param columns: the table columns to return, in this order (default: keys, then values).
    :param filter: a ``pyarrow.compute`` expression over table columns (any, returned or
        not), e.g. ``pc.field("amount") > 100``: the rows of the table that satisfy it. It is
        applied to the merged rows, never to the runs' rows (a key whose older version
        matches but whose current one does not is not in the result); the merge then reads
        every table column.
    :param batch_rows: rows per output batch at most.

    Which runs are read is decided now, on one snapshot of consensus (refused outside
    since <= as_of <= upper, as :meth:`Shard.live_runs` refuses it), and every listed file is
    checked to exist; the files are read while the reader is consumed. A file that compaction
    replaced and GC deleted in between is :class:`ReadOutdated` (retryable), not damage. Memory: a record
    batch per run file of one bucket plus one output batch (module docstring)."""
    import pyarrow as pa

    runs = shard.live_runs(as_of)
    # A file lost to compaction and GC between this choice of runs and its reading is the
    # retryable ReadOutdated, not an integrity error (Shard.reading decides, after the failure:
    # nothing is checked before reading).
    with shard.reading(runs):
        reader = read_runs_arrow(shard.config_for_runs(runs), shard.blob, runs, columns, filter, shard_id=shard.shard_id,
                                 batch_rows=batch_rows)
        # The first batch is read now: a read that cannot start fails here, not at its consumer.
        first = next(iter(reader), None)

    def batches() -> Iterator["pyarrow.RecordBatch"]:
        if first is None:
            return
        yield first
        with shard.reading(runs):
            yield from reader

    return pa.RecordBatchReader.from_batches(reader.schema, batches())


def read_table_from_store(
    consensus_url: str,
    blob_root: str,
    shard_id: str,
    *,
    as_of: int | None = None,
    columns: Sequence[str] | None = None,
    filter: "pyarrow.compute.Expression | None" = None,  # noqa: A002
    batch_rows: int = BATCH_ROWS,
) -> "pyarrow.RecordBatchReader":
    """:func:`read_table` of the shard ``shard_id`` of the store at ``consensus_url``
    (``sqlite:///PATH`` or ``postgresql://...``) whose runs are below ``blob_root`` (a local
    path or ``s3://BUCKET/PREFIX``), without Airflow or Spark. The store is opened read-only
    (a store without tables is refused, never created) and closed before this returns: what
    to read is decided then, the reader needs only the blob."""
    from airflow_upsert_provider.engine.blob.files import open_blob
    from airflow_upsert_provider.engine.store.registry import open_consensus
    from airflow_upsert_provider.engine.table.shard import Shard

    consensus = open_consensus(consensus_url, create=False)
    try:
        shard = Shard.open(consensus, open_blob(blob_root), shard_id)
        return read_table(shard, as_of, columns, filter, batch_rows=batch_rows)
    finally:
        consensus.dispose()


def read_runs_arrow(
    config: ShardConfig,
    blob: Blob,
    runs: list[dict[str, Any]],
    columns: Sequence[str] | None = None,
    filter: "pyarrow.compute.Expression | None" = None,  # noqa: A002
    *,
    shard_id: str | None = None,
    batch_rows: int = BATCH_ROWS,
    read_file: FileReader | None = None,
) -> "pyarrow.RecordBatchReader":
    """Merge ``runs`` as :func:`runs.read_runs` does, with pyarrow, one bucket at a time.
    ``read_file`` replaces how one run file is read (tests observe what is held through it)."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    if batch_rows < 1:
        raise ConfigurationError(f"batch_rows must be at least 1, not {batch_rows}", field="batch_rows")
    output = output_columns(config, columns)
    order = order_column(config)
    full_schema = to_arrow_schema(run_schema(config), timezone="UTC")
    # The filter may name any table column: the merge then keeps them all (pyarrow does not
    # say which columns an expression names), and the output drops what was not asked for.
    merged = output if filter is None else list(dict.fromkeys([*output, *table_columns(config)]))
    # Read only what the merge ranks by and what is returned.
    needed = list(dict.fromkeys([*config.keys, *merged, *([order] if order else []), "_deleted", "_ts"]))
    read_schema = pa.schema([full_schema.field(name) for name in needed])
    out_schema = pa.schema([full_schema.field(name) for name in output])
    if filter is not None:
        check_filter(filter, pa.schema([full_schema.field(name) for name in merged]))
    files = [f for run in runs for f in run["files"]]
    # Runs written before and after the bucket count grew are merged by the groups every count
    # refines: a key's rows are all in one group of every run.
    groups = read_group_count(config, runs)
    reader = read_file or _read_run_file

    streamed = not any(pa.types.is_floating(read_schema.field(k).type) for k in config.keys)

    def finished(winners: "pyarrow.Table") -> "pyarrow.Table":
        return winners if filter is None else winners.filter(filter).select(output)

    def batches() -> Iterator["pyarrow.RecordBatch"]:
        for _group, listed in bucket_groups(files, groups):
            if not streamed:
                rows = _read_bucket(blob, listed, read_schema, reader, shard_id)
                winners = merge_bucket(rows, config, merged)
                del rows  # the bucket's input goes before its output is handed out
                yield from finished(winners).to_batches(max_chunksize=batch_rows)
                continue
            streams = [_file_batches(blob, f, read_schema, reader, shard_id) for f in listed]
            pending: list[pa.Table] = []
            held = 0
            # Winners are handed out in batches of batch_rows (a bucket's last one may be
            # short): the consumer's batches do not shrink to what one step of the merge decides.
            for winners in _named_unsorted(merge_sorted_streams(streams, config, merged), blob, listed, shard_id):
                winners = finished(winners)
                pending.append(winners)
                held += winners.num_rows
                if held >= batch_rows:
                    whole = pa.concat_tables(pending)
                    cut = held - held % batch_rows
                    yield from whole.slice(0, cut).to_batches(max_chunksize=batch_rows)
                    pending, held = [whole.slice(cut)], held - cut
            if held:
                yield from pa.concat_tables(pending).combine_chunks().to_batches(max_chunksize=batch_rows)

    return pa.RecordBatchReader.from_batches(out_schema, batches())


def check_filter(filter: Any, schema: "pyarrow.Schema") -> None:  # noqa: A002
    """Refuse, before anything is read, a filter that is not a ``pyarrow.compute`` expression
    or that does not evaluate to booleans over the table's columns (an unknown column, a
    type mismatch), naming it."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not isinstance(filter, pc.Expression):
        raise ConfigurationError(
            f"filter is a pyarrow.compute expression (e.g. pc.field('amount') > 100), not a {type(filter).__name__}",
            field="filter",
        )
    try:
        schema.empty_table().filter(filter)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, TypeError) as exc:
        first = first_line(exc) or type(exc).__name__
        raise ConfigurationError(
            f"filter {filter} does not apply to the table's columns ({', '.join(schema.names)}): {first}",
            field="filter",
        ) from exc


def output_columns(config: ShardConfig, columns: Sequence[str] | None) -> list[str]:
    """The columns a read returns: ``columns`` as given, each a table column (the delete
    marker is not one), or the keys then the values."""
    table = table_columns(config)
    if columns is None:
        return [*config.keys, *[c for c in table if c not in config.keys]]
    if isinstance(columns, str):
        raise ConfigurationError("columns is a list of column names, not one string", field="columns")
    unknown = [c for c in columns if c not in table]
    if unknown:
        raise ConfigurationError(
            f"unknown column {unknown[0]!r}; the table's columns are {', '.join(table)}", field="columns"
        )
    if len(set(columns)) != len(columns):
        raise ConfigurationError("columns names a column twice", field="columns")
    return list(columns)


def bucket_groups(
    files: list[dict[str, Any]], group_count: int | None = None
) -> list[tuple[int | None, list[dict[str, Any]]]]:
    """The listed run files grouped by their bucket (from the ``_bucket=<n>`` directory every
    run writer puts a file in) modulo ``group_count`` (``runs.read_group_count``; None: by
    bucket), by group number; one group of all files (None) if any file is outside such a
    directory, since its keys could then be in any bucket."""
    groups: dict[int, list[dict[str, Any]]] = {}
    for f in files:
        match = _BUCKET_DIR.search(f["path"])
        if match is None:
            return [(None, list(files))] if files else []
        bucket = int(match.group(1))
        groups.setdefault(bucket if group_count is None else bucket % group_count, []).append(f)
    return sorted(groups.items())


def merge_bucket(
    rows: "pyarrow.Table", config: ShardConfig, output: list[str], *, keep_tombstones: bool = False
) -> "pyarrow.Table":
    """Per key the winning row of ``rows`` (run columns of one bucket), tombstones removed
    (kept with ``keep_tombstones``: the change feed compares winners), ``output`` columns,
    sorted by key. Pure.

    The rank is :func:`runs.merge_rows`'s: the order value (null lowest, NaN highest), then
    ``_ts``; both descending so the first row of a key after the sort is its winner."""
    import numpy
    import pyarrow as pa
    import pyarrow.compute as pc

    if rows.num_rows == 0:
        return rows.select(output)
    keys = list(config.keys)
    order = order_column(config)
    ranking = {name: rows.column(name) for name in keys}
    rank: list[tuple[str, str]] = []
    if order is not None:
        value = rows.column(order)
        if pa.types.is_floating(value.type):
            # Spark orders NaN above every number; Arrow sorts it beside the nulls.
            ranking["_nan"] = pc.fill_null(pc.is_nan(value), False)
            rank.append(("_nan", "descending"))
        # Nulls rank lowest: sorted after every value, whatever the null placement defaults to.
        ranking["_valid"] = pc.is_valid(value)
        ranking["_order"] = value
        rank += [("_valid", "descending"), ("_order", "descending")]
    ranking["_ts"] = rows.column("_ts")
    rank.append(("_ts", "descending"))
    ranked = pa.table(ranking)
    order_of_rows = pc.sort_indices(ranked, sort_keys=[(k, "ascending") for k in keys] + rank)
    by_key = ranked.select(keys).take(order_of_rows)
    by_key = by_key.append_column("_position", pa.array(numpy.arange(by_key.num_rows, dtype=numpy.int64)))
    # Rows are sorted by key and rank: each key's first position holds its winner.
    firsts = by_key.group_by(keys, use_threads=False).aggregate([("_position", "min")])
    first_positions = pc.sort_indices(firsts.column("_position_min"))
    winners = rows.take(order_of_rows.take(firsts.column("_position_min").take(first_positions)))
    if keep_tombstones:
        return winners.select(output)
    return winners.filter(pc.invert(pc.fill_null(winners.column("_deleted"), False))).select(output)


def merge_sorted_streams(
    streams: Sequence[Iterator["pyarrow.RecordBatch"]], config: ShardConfig, output: list[str]
) -> Iterator["pyarrow.Table"]:
    """The winners of :func:`merge_bucket` over every row of ``streams``, each stream the
    record batches of one run file sorted by key, computed as a k-way merge: per step, the
    rows of every stream below the smallest last key any stream's held batch reaches (a key
    below it has no row left unread anywhere) are merged with :func:`merge_bucket` and
    handed out, in key order; then the streams whose held rows all carry that key read
    their next batch. What is held is one batch per stream (plus, for a stream whose batch
    ends inside a key, that key's rows of its previous batches), never the bucket.

    A stream whose keys go down is not a run this engine wrote: :class:`IntegrityError`.
    Keys compare as Arrow compares them (bytes for strings), which is how Spark sorted them
    for every key type but floating point (NaN): those are merged whole by the caller."""
    import pyarrow as pa

    keys = list(config.keys)
    held: list[pa.Table | None] = [None] * len(streams)
    open_streams = set(range(len(streams)))

    def read_next(i: int) -> None:
        for batch in streams[i]:
            if batch.num_rows == 0:
                continue
            table = pa.Table.from_batches([batch])
            _check_sorted(table, keys, held[i], i)
            held[i] = table if held[i] is None or held[i].num_rows == 0 else pa.concat_tables([held[i], table])
            return
        open_streams.discard(i)

    for i in range(len(streams)):
        read_next(i)
    while True:
        lasts = {i: _key_at(held[i], keys, held[i].num_rows - 1) for i in open_streams}
        bound = min(lasts.values()) if lasts else None
        ready = []
        for i, table in enumerate(held):
            if table is None or table.num_rows == 0:
                continue
            below = table.num_rows if bound is None else _rows_below(table, keys, bound)
            if below:
                ready.append(table.slice(0, below))
                held[i] = table.slice(below)
        if ready:
            yield merge_bucket(pa.concat_tables(ready), config, output)
        if bound is None:
            return
        for i, last in lasts.items():
            if last == bound:  # every row it holds is of the bound key: read on
                read_next(i)


def _key_at(table: "pyarrow.Table", keys: list[str], row: int) -> tuple:
    return tuple(table.column(k)[row].as_py() for k in keys)


def _key_less(table: "pyarrow.Table", keys: list[str], bound: "Sequence[Any] | pyarrow.Table") -> "pyarrow.Array":
    """Per row of ``table``: its key is below ``bound`` (a key tuple, or a table of keys row
    for row), lexicographically over ``keys``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    less = equal = None
    for n, name in enumerate(keys):
        column = table.column(name)
        other = bound.column(name) if isinstance(bound, pa.Table) else pa.scalar(bound[n], type=column.type)
        below = pc.less(column, other)
        less = below if less is None else pc.or_(less, pc.and_(equal, below))
        same = pc.equal(column, other)
        equal = same if equal is None else pc.and_(equal, same)
    return less


def _rows_below(table: "pyarrow.Table", keys: list[str], bound: tuple) -> int:
    """How many of the first rows of ``table`` (sorted by key) have a key below ``bound``."""
    import pyarrow.compute as pc

    return int(pc.sum(_key_less(table, keys, bound)).as_py() or 0)


def _check_sorted(table: "pyarrow.Table", keys: list[str], before: "pyarrow.Table | None", stream: int) -> None:
    import pyarrow as pa
    import pyarrow.compute as pc

    rows = table if before is None or before.num_rows == 0 else pa.concat_tables([before.slice(before.num_rows - 1), table])
    if rows.num_rows > 1 and pc.any(_key_less(rows.slice(1), keys, rows.slice(0, rows.num_rows - 1))).as_py():
        raise _NotSorted(stream)


class _NotSorted(Exception):
    """A run file whose keys go down (raised inside the merge; the reader names the file)."""

    def __init__(self, stream: int) -> None:
        super().__init__(stream)
        self.stream = stream


def _named_unsorted(
    merged: Iterator["pyarrow.Table"], blob: Blob, listed: list[dict[str, Any]], shard_id: str | None
) -> Iterator["pyarrow.Table"]:
    """``merged``, a run file found not sorted by key an :class:`IntegrityError` naming it."""
    try:
        yield from merged
    except _NotSorted as exc:
        path = blob.path(listed[exc.stream]["path"])
        raise _run_file_error(path, shard_id, f"is not sorted by key, as every run file is written: {path}",
                              "not sorted by key") from None


def _run_file_error(path: str, shard_id: str | None, what: str, reason: str) -> IntegrityError:
    """The :class:`IntegrityError` of a committed run file at ``path`` that is not what the
    shard wrote: ``what`` it is, and the ``reason`` its record gives."""
    owner = f" of shard {shard_id!r}" if shard_id else ""
    return IntegrityError(
        f"a file of the committed runs{owner} {what} (restore the shard from a checkpoint: "
        "`upsertctl checkpoint restore`)",
        **({"shard": shard_id} if shard_id else {}),
        file=path,
        records=[{"file": path, "reason": reason}],
        count=1,
    )


def _file_batches(
    blob: Blob, listed: dict[str, Any], schema: "pyarrow.Schema", read_file: FileReader, shard_id: str | None
) -> Iterator["pyarrow.RecordBatch"]:
    """The record batches of one listed run file, read as they are asked for; a failure is
    the engine error it stands for (:func:`_read_failure`)."""
    try:
        yield from read_file(blob.root, listed, schema)
    except UpsertError:
        raise
    except Exception as exc:
        error = _read_failure(blob, listed, exc, shard_id)
        if error is None:
            raise
        raise error from exc


def read_run_file_batches(
    blob: Blob, listed: dict[str, Any], schema: "pyarrow.Schema", shard_id: str | None,
    read_file: FileReader | None = None,
) -> Iterator["pyarrow.RecordBatch"]:
    """The record batches of the listed run file ``listed`` in ``schema``, read as they are
    asked for (by ``read_file``, default the executors' reader); a failure is the engine error
    it stands for, as in a read of the table."""
    return _file_batches(blob, listed, schema, read_file or _read_run_file, shard_id)


def _read_bucket(
    blob: Blob, listed: list[dict[str, Any]], schema: "pyarrow.Schema", read_file: FileReader, shard_id: str | None
) -> "pyarrow.Table":
    import pyarrow as pa

    batches: list[pa.RecordBatch] = []
    for f in listed:
        batches.extend(_file_batches(blob, f, schema, read_file, shard_id))
    return pa.Table.from_batches(batches, schema=schema)


def _read_run_file(root: str, listed: dict[str, Any], schema: "pyarrow.Schema") -> Iterator["pyarrow.RecordBatch"]:
    return run_io.read_files(root, [listed["path"]], schema, sizes=[listed["bytes"]])


def _read_failure(blob: Blob, listed: dict[str, Any], exc: Exception, shard_id: str | None) -> UpsertError | None:
    """The engine error a failed read of the run file ``listed`` stands for: the store's own
    (object storage unavailable, access denied), an :class:`IntegrityError` naming the file
    when it is not what the shard's state recorded, else None (the original error stands)."""
    from airflow_upsert_provider.engine.spark.executor_errors import carried_error

    carried = carried_error(exc)  # run_io.read_files raises a store's error in the executors' form
    if carried is not None:
        return carried
    recorded = {"path": listed["path"], "bytes": listed["bytes"], "sha256": listed.get("sha256")}
    reason = file_problem(blob, recorded, "the shard's state")[1]
    if reason is None:
        return None
    path = blob.path(listed["path"])
    what = f"is missing: {path}" if reason == "missing" else f"is damaged: {path}: {reason}"
    return _run_file_error(path, shard_id, what, reason)
