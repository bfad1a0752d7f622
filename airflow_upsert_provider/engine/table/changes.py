"""The change feed without Spark: per key, the net change of a shard's table over the batches
``from_ts <= ts < to_ts``, as Arrow record batches (docs/changes.md).

Each batch is a run per bucket of exactly the keys it changed, so the feed reads the range's
batch runs (its changes), and, to tell an insert from an update and to give the row an
update or a delete replaces, the rows of those keys in the runs a read as of ``from_ts``
merges. Bucket by bucket, as the Arrow reader reads the table (a key's rows are all in one
bucket group of every run): the group's range rows are read whole (they are what changed),
the runs as of ``from_ts`` are streamed a record batch at a time and only the rows of the
changed keys are kept (:func:`rows_of_keys`: a binary search per changed key in a sorted
batch), so memory follows a bucket's changes, not the table. Without pre-images (the default)
only the keys, order value, tombstone flag and ts of the runs as of ``from_ts`` are decoded,
not their values: most of what they hold. Per key:

- the winner as of ``from_ts`` (tombstones kept: a tombstone with a high order value still
  beats a later row; a key found once, in key order, is its own winner without a merge) and
  the winner as of ``to_ts`` (that one and the range's rows, merged by the engine's rule:
  order value, then ``_ts``), the two aligned by key;
- the net change between the two rows, each absent when it is a tombstone or missing
  (``change_rules.net_change``): ``insert`` or ``update_postimage`` with the row as of
  ``to_ts``, ``delete`` (the key; with pre-images the row as of ``from_ts``), and with
  pre-images ``update_preimage`` with the row as of ``from_ts``;
- ``_commit_version``: the ts of the winner as of ``to_ts`` (the key's last change that
  counts), ``_commit_timestamp``: when that batch was committed.

The runs are chosen on one snapshot of consensus; a file that compaction replaced and GC
deleted before it was read is the retryable :class:`ReadOutdated` (``Shard.reading``), as for
any read.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_upsert_provider.engine.store.records import BatchRecord, live_runs
from airflow_upsert_provider.engine.table.arrow_reader import (
    BATCH_ROWS,
    FileReader,
    bucket_groups,
    merge_bucket,
    output_columns,
    read_run_file_batches,
)
from airflow_upsert_provider.engine.table.change_rules import (
    CHANGE_TYPE,
    COMMIT_TIMESTAMP,
    COMMIT_VERSION,
    DELETE,
    INSERT,
    UPDATE_POSTIMAGE,
    UPDATE_PREIMAGE,
    check_changes_range,
    range_batches,
)
from airflow_upsert_provider.engine.table.run_io import read_files, with_null_columns
from airflow_upsert_provider.engine.table.runs import order_column, read_group_count, run_schema

if TYPE_CHECKING:
    import pyarrow

    from airflow_upsert_provider.engine.config import ShardConfig
    from airflow_upsert_provider.engine.table.shard import Shard

# The order of a key's rows in the feed: a pre-image before its post-image.
_TYPE_RANK = {DELETE: 0, UPDATE_PREIMAGE: 1, UPDATE_POSTIMAGE: 2, INSERT: 3}
# Rows decoded at once from a run as of from_ts when only its keys, order value, tombstone flag
# and ts are read (no pre-images): at most 25 bytes a row of an int64 key, so a batch holds
# about 26 MB, and decoding 1,048,576 rows at once costs 0.84x of eight batches of 131,072
# (a 1.25M-row bucket file: 31 against 38 ms of CPU), with one binary search per batch.
NARROW_SCAN_ROWS = 1 << 20


def _read_narrow(root: str, listed: dict[str, Any], schema: "pyarrow.Schema") -> Iterator["pyarrow.RecordBatch"]:
    """One run file's rows in the narrow ``schema`` (keys, order value, tombstone flag, ts),
    :data:`NARROW_SCAN_ROWS` at a time."""
    return read_files(root, [listed["path"]], schema, sizes=[listed["bytes"]], batch_rows=NARROW_SCAN_ROWS)


@dataclass(frozen=True)
class ChangePlan:
    """What a feed of ``[from_ts, to_ts)`` reads, decided on one snapshot of consensus: the runs
    a read as of ``from_ts`` merges and the range's batches."""

    shard_id: str
    from_ts: int
    to_ts: int
    since: int
    upper: int
    before_runs: list[dict[str, Any]]
    batches: list[BatchRecord]

    @property
    def runs(self) -> list[dict[str, Any]]:
        """Every run the feed reads."""
        return [*self.before_runs, *(b.run for b in self.batches)]


def plan_changes(shard: "Shard", from_ts: int, to_ts: int | None = None) -> ChangePlan:
    """The runs a feed of ``[from_ts, to_ts)`` (default: to the upper) reads, from one snapshot
    of consensus; refused, naming the range and since, when it is not answerable
    (``change_rules.check_changes_range``)."""
    view = shard.consensus.live_view(shard.shard_id, to_ts)
    record = view.record
    start, end = check_changes_range(shard.shard_id, from_ts, view.as_of, since=record.since, upper=record.upper)
    return ChangePlan(
        shard.shard_id, start, end, record.since, record.upper,
        live_runs(view.compaction, view.batches, start),
        range_batches(view.batches, start, end, shard.shard_id),
    )


def change_schema(config: "ShardConfig", columns: Sequence[str] | None = None) -> "pyarrow.Schema":
    """The feed's columns: the table's (``columns``, default keys then values), then
    ``_change_type`` (string), ``_commit_version`` (int64) and ``_commit_timestamp`` (UTC)."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    full = to_arrow_schema(run_schema(config), timezone="UTC")
    return pa.schema([
        *(full.field(c) for c in output_columns(config, columns)),
        pa.field(CHANGE_TYPE, pa.string()),
        pa.field(COMMIT_VERSION, pa.int64()),
        pa.field(COMMIT_TIMESTAMP, pa.timestamp("us", tz="UTC")),
    ])


def read_changes(
    shard: "Shard",
    from_ts: int,
    to_ts: int | None = None,
    *,
    columns: Sequence[str] | None = None,
    preimages: bool = False,
    batch_rows: int = BATCH_ROWS,
    read_file: FileReader | None = None,
) -> "pyarrow.RecordBatchReader":
    """The net change per key of the table of ``shard`` over the batches ``from_ts <= ts <
    to_ts`` (default: to the upper), as Arrow record batches, without Spark (module docstring).

    :param columns: the table columns to return, in this order (default: keys, then values);
        the change columns follow them.
    :param preimages: also give each update's row as of ``from_ts`` (``update_preimage``) and
        each deleted row's values, and leave out rewrites to equal values; this reads the
        values of the runs as of ``from_ts``, not only their keys (docs/changes.md).
    :param batch_rows: rows per output batch at most.
    :param read_file: replaces how one run file is read (tests hold a read there).

    ``.read_all()`` gives a ``pyarrow.Table``; iterating streams a bucket at a time."""
    import pyarrow as pa

    plan = plan_changes(shard, from_ts, to_ts)
    schema = change_schema(shard.config, columns)
    batches = change_batches(shard, plan, schema, preimages=preimages, batch_rows=batch_rows, read_file=read_file)
    # A read that cannot start fails here (ReadOutdated, damage), not at its consumer.
    with shard.reading(plan.runs):
        first = next(batches, None)

    def rest() -> Iterator["pyarrow.RecordBatch"]:
        if first is None:
            return
        yield first
        with shard.reading(plan.runs):
            yield from batches

    return pa.RecordBatchReader.from_batches(schema, rest())


def change_batches(
    shard: "Shard",
    plan: ChangePlan,
    schema: "pyarrow.Schema",
    *,
    preimages: bool = False,
    batch_rows: int = BATCH_ROWS,
    read_file: FileReader | None = None,
) -> Iterator["pyarrow.RecordBatch"]:
    """The feed of ``plan`` in ``schema`` (:func:`change_schema`), one bucket group after the
    other, sorted by key within a group; ``preimages`` as for :func:`read_changes`."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    config = shard.config
    if not plan.batches:
        return
    full = to_arrow_schema(run_schema(config), timezone="UTC")
    order = order_column(config)
    keys = list(config.keys)
    table = output_columns(config, None)
    needed = list(dict.fromkeys([*table, *([order] if order else []), "_deleted", "_ts"]))
    read_schema = pa.schema([full.field(n) for n in needed])
    # Without pre-images, the rows as of from_ts only decide insert, update or delete: their
    # keys, order value, tombstone flag and ts are read, not the values (most of a run's bytes).
    before_schema = read_schema if preimages else pa.schema(
        [full.field(n) for n in dict.fromkeys([*keys, *([order] if order else []), "_deleted", "_ts"])])
    groups = read_group_count(config, plan.runs)
    changed_files = bucket_groups([f for b in plan.batches for f in b.run["files"]], groups)
    before_files = dict(bucket_groups([f for run in plan.before_runs for f in run["files"]], groups))
    if None in before_files or (changed_files and changed_files[0][0] is None):
        # A file outside a bucket directory: its keys could be anywhere, so one group of all.
        changed_files = [(None, [f for b in plan.batches for f in b.run["files"]])]
        before_files = {None: [f for run in plan.before_runs for f in run["files"]]}
    committed = pa.table({"_ts": pa.array([b.ts for b in plan.batches], pa.int64()),
                          "_at": pa.array([b.committed_at for b in plan.batches], pa.float64())})

    def read(files: list[dict[str, Any]], schema: "pyarrow.Schema",
             reader: FileReader | None = read_file) -> Iterator["pyarrow.RecordBatch"]:
        for f in files:
            yield from read_run_file_batches(shard.blob, f, schema, shard.shard_id, reader)

    before_reader = read_file or (None if preimages else _read_narrow)

    for group, files in changed_files:
        changes = pa.Table.from_batches(list(read(files, read_schema)), schema=read_schema)
        if changes.num_rows == 0:
            continue
        before_rows = [with_null_columns(rows, read_schema) for rows in
                       rows_of_keys(read(before_files.get(group, []), before_schema, before_reader), changes, keys)]
        before = pa.Table.from_batches(before_rows, schema=read_schema)
        del before_rows
        # Found in key order with one row per key (one run as of from_ts, the common case after a
        # compaction), each row is its key's winner already: no merge.
        at_from = (before.select(needed) if _strictly_increasing(before, keys)
                   else merge_bucket(before, config, needed, keep_tombstones=True))
        at_to = merge_bucket(pa.concat_tables([at_from, changes]), config, needed, keep_tombstones=True)
        feed = net_changes(at_from, at_to, config, table, committed, preimages=preimages)
        yield from feed.select(schema.names).cast(schema).to_batches(max_chunksize=batch_rows)


def rows_of_keys(
    batches: Iterator["pyarrow.RecordBatch"], changes: "pyarrow.Table", keys: list[str]
) -> Iterator["pyarrow.RecordBatch"]:
    """The rows of ``batches`` whose key is one of ``changes``' keys, a batch at a time.

    One integer key column in a batch sorted by it (a run is sorted by key within a bucket):
    each changed key inside the batch's range is looked up by binary search
    (:func:`sorted_positions`), so the cost follows the changed keys, not the batch's rows.
    Another key column, or a batch out of order: a hash lookup per row (``is_in``). A compound
    key: a semi join."""
    import numpy
    import pyarrow as pa
    import pyarrow.compute as pc

    if len(keys) == 1:
        wanted = pc.unique(changes.column(keys[0]))
        wanted_sorted = (numpy.sort(wanted.to_numpy()) if pa.types.is_integer(wanted.type) and wanted.null_count == 0
                         else None)
        for batch in batches:
            column = batch.column(keys[0])
            positions = None
            if wanted_sorted is not None and column.null_count == 0:
                positions = sorted_positions(column.to_numpy(), wanted_sorted)
            kept = (batch.filter(pc.is_in(column, value_set=wanted)) if positions is None
                    else batch.take(pa.array(positions)))
            if kept.num_rows:
                yield kept
        return
    wanted_keys = changes.select(keys).group_by(keys, use_threads=False).aggregate([])
    for batch in batches:
        kept = pa.Table.from_batches([batch]).join(wanted_keys, keys, join_type="left semi")
        if kept.num_rows:
            yield from kept.select(batch.schema.names).cast(batch.schema).to_batches()


def _strictly_increasing(rows: "pyarrow.Table", keys: list[str]) -> bool:
    """Whether ``rows`` has one integer key column, without nulls, whose values strictly
    increase: each key once, in key order. Pure."""
    import numpy
    import pyarrow as pa

    if len(keys) != 1 or not pa.types.is_integer(rows.schema.field(keys[0]).type):
        return False
    column = rows.column(keys[0])
    if column.null_count:
        return False
    values = column.to_numpy()
    return bool((values[1:] > values[:-1]).all())


def sorted_positions(column: "numpy.ndarray", wanted: "numpy.ndarray") -> "numpy.ndarray | None":
    """The positions in ``column`` of the values in ``wanted`` (sorted), in ``column``'s order,
    every row of a repeated value included, found by binary search; None when ``column`` is not
    sorted (ascending). Pure."""
    import numpy

    if column.size == 0:
        return numpy.empty(0, numpy.int64)
    if column.size > 1 and not bool((column[1:] >= column[:-1]).all()):
        return None
    inside = wanted[numpy.searchsorted(wanted, column[0], "left"):numpy.searchsorted(wanted, column[-1], "right")]
    starts = numpy.searchsorted(column, inside, "left")
    counts = numpy.searchsorted(column, inside, "right") - starts
    starts, counts = starts[counts > 0], counts[counts > 0]
    # Every position of each found run of equal values: start, start + 1, ..., start + count - 1.
    offsets = numpy.arange(int(counts.sum()), dtype=numpy.int64) - numpy.repeat(numpy.cumsum(counts) - counts, counts)
    return numpy.repeat(starts, counts).astype(numpy.int64) + offsets


def net_changes(
    at_from: "pyarrow.Table", at_to: "pyarrow.Table", config: "ShardConfig", table: list[str],
    committed: "pyarrow.Table", *, preimages: bool = True,
) -> "pyarrow.Table":
    """The feed rows of one bucket group: ``at_from`` and ``at_to`` are the winners (run columns,
    tombstones kept) as of the range's start and end of every key the range changed;
    ``committed`` maps a batch's ``_ts`` to its commit time ``_at``. Pure (Arrow in, Arrow out),
    sorted by key, a key's pre-image before its post-image.

    Without ``preimages`` (``at_from``'s values are then null, unread), a key whose winner
    changed is an ``update_postimage`` alone, whatever its values, and a delete carries only
    the key (``change_rules.net_change``)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    keys = list(config.keys)
    values = [c for c in table if c not in keys]
    present_from = at_from.filter(pc.invert(pc.fill_null(at_from.column("_deleted"), False)))
    renamed = {c: f"__from_{c}" for c in [*values, "_ts"]}
    before = present_from.select([*keys, *renamed]).rename_columns([*keys, *renamed.values()])
    if not preimages:
        # The order value was read to merge; a delete without pre-images carries only the key.
        for c in values:
            at = before.schema.get_field_index(renamed[c])
            before = before.set_column(at, renamed[c], pa.nulls(before.num_rows, before.schema.field(at).type))
    before = before.append_column("__in_from", pa.array([True] * before.num_rows, pa.bool_()))
    after = at_to.select([*keys, *values, "_deleted", "_ts"])
    joined = _left_join_sorted(after, before, keys)
    in_from = pc.fill_null(joined.column("__in_from"), False)
    in_to = pc.invert(pc.fill_null(joined.column("_deleted"), False))
    # The same winner on both sides (every row of the range lost to it), or equal values.
    same = pc.fill_null(pc.equal(joined.column("_ts"), joined.column("__from__ts")), False)
    unchanged = same
    if preimages:
        equal_values = pa.array([True] * joined.num_rows, pa.bool_())
        for c in values:
            equal_values = pc.and_(equal_values, _null_safe_equal(joined.column(c), joined.column(renamed[c])))
        unchanged = pc.or_(same, equal_values)
    inserted = pc.and_(in_to, pc.invert(in_from))
    deleted = pc.and_(in_from, pc.invert(in_to))
    updated = pc.and_(pc.and_(in_from, in_to), pc.invert(unchanged))

    def rows(mask: "pyarrow.Array", kind: str, side: str) -> "pyarrow.Table":
        chosen = joined.filter(mask)
        names = values if side == "to" else [renamed[c] for c in values]
        out = chosen.select([*keys, *names]).rename_columns([*keys, *values])
        out = out.append_column(CHANGE_TYPE, pa.repeat(pa.scalar(kind, pa.string()), out.num_rows))
        out = out.append_column(COMMIT_VERSION, chosen.column("_ts"))
        return out.append_column("__rank", pa.repeat(pa.scalar(_TYPE_RANK[kind], pa.int8()), out.num_rows))

    parts = [rows(deleted, DELETE, "from"), *([rows(updated, UPDATE_PREIMAGE, "from")] if preimages else []),
             rows(updated, UPDATE_POSTIMAGE, "to"), rows(inserted, INSERT, "to")]
    feed = pa.concat_tables(parts)
    order = pc.sort_indices(feed, sort_keys=[*((k, "ascending") for k in keys), ("__rank", "ascending")])
    feed = feed.take(order).drop_columns(["__rank"])
    at = committed.column("_at").take(pc.index_in(feed.column(COMMIT_VERSION), value_set=committed.column("_ts")))
    # Whole microseconds, cut down (floor: the same in Spark's reader for the same double).
    micros = pc.cast(pc.floor(pc.multiply(at, 1_000_000)), pa.int64())
    return feed.append_column(COMMIT_TIMESTAMP, pc.cast(micros, pa.timestamp("us", tz="UTC")))


def _left_join_sorted(after: "pyarrow.Table", before: "pyarrow.Table", keys: list[str]) -> "pyarrow.Table":
    """``after`` with ``before``'s other columns beside each row of the same key (null where
    ``before`` has none), in ``after``'s order: both sorted by key, one row per key, every key
    of ``before`` also in ``after``. One integer key: aligned by binary search; otherwise a
    hash join. Pure."""
    import numpy
    import pyarrow as pa

    key = keys[0]
    if (len(keys) == 1 and pa.types.is_integer(after.schema.field(key).type)
            and after.column(key).null_count == 0 and before.column(key).null_count == 0):
        after_keys, before_keys = after.column(key).to_numpy(), before.column(key).to_numpy()
        at = numpy.searchsorted(after_keys, before_keys)
        if bool((at < after_keys.size).all()) and bool((after_keys[at] == before_keys).all()):
            rows = numpy.full(after_keys.size, -1, numpy.int64)
            rows[at] = numpy.arange(before_keys.size, dtype=numpy.int64)
            beside = before.drop_columns(keys).take(pa.array(rows, mask=rows < 0))
            return pa.Table.from_arrays([*after.columns, *beside.columns],
                                        names=[*after.column_names, *beside.column_names]).combine_chunks()
    return after.join(before, keys, join_type="left outer").combine_chunks()


def _null_safe_equal(left: "pyarrow.ChunkedArray", right: "pyarrow.ChunkedArray") -> "pyarrow.Array":
    """Per row: equal values, or both null."""
    import pyarrow.compute as pc

    both_null = pc.and_(pc.is_null(left), pc.is_null(right))
    return pc.or_(pc.fill_null(pc.equal(left, right), False), both_null)
