"""The consensus store's own tables: shards, bindings, batches, settled source names, batch
rollups, quarantined files and compactions, on the one ``metadata`` every table of the store
joins (store/registry.py lists which a store creates)."""

from __future__ import annotations

import sqlalchemy as sa


metadata = sa.MetaData()

shards_table = sa.Table(
    "upsert_shards",
    metadata,
    sa.Column("shard_id", sa.String(128), primary_key=True),
    sa.Column("upper", sa.BigInteger, nullable=False),
    sa.Column("since", sa.BigInteger, nullable=False),
    # Bumped by every state change; compaction (which leaves upper alone) compares on it.
    sa.Column("seqno", sa.BigInteger, nullable=False),
    sa.Column("config", sa.Text, nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
)

# binding(ts): which source offsets batch ts covers. Inserted once, never updated.
bindings_table = sa.Table(
    "upsert_bindings",
    metadata,
    sa.Column("shard_id", sa.String(128), primary_key=True),
    sa.Column("ts", sa.BigInteger, primary_key=True),
    sa.Column("ranges", sa.Text, nullable=False),
    sa.Column("minted_by", sa.String(512), nullable=False),
    sa.Column("minted_at", sa.Float, nullable=False),
)

# The one committed batch of every ts < upper (invariant 2: the primary key makes it one).
batches_table = sa.Table(
    "upsert_batches",
    metadata,
    sa.Column("shard_id", sa.String(128), primary_key=True),
    sa.Column("ts", sa.BigInteger, primary_key=True),
    sa.Column("writer_id", sa.String(512), nullable=False),
    sa.Column("token", sa.String(64), nullable=False),
    sa.Column("run", sa.Text, nullable=False),
    sa.Column("stats", sa.Text, nullable=False),
    sa.Column("committed_at", sa.Float, nullable=False),
)

# What planning a batch knows about a source partition (store/source_index.py): its names
# whose verdict is settled as of a binding. Here because a snapshot carries it: a restored
# shard checks it against the binding it is anchored at, and catches up from the later ones.
settled_names_table = sa.Table(
    "upsert_source_settled",
    metadata,
    sa.Column("shard_id", sa.String(128), primary_key=True),
    sa.Column("partition", sa.String(512), primary_key=True),
    # The binding these names are settled through; -1 before the first binding.
    sa.Column("through_ts", sa.BigInteger, nullable=False),
    # Digest of that binding: a row left by an earlier shard of the same id does not match.
    sa.Column("binding_digest", sa.String(64), nullable=False),
    # File names joined by "/", the one character no file name holds.
    sa.Column("names", sa.Text, nullable=False),
)

# The audit summary of batch rows truncated below since (store/history.py): one row per
# truncation, [from_ts, to_ts).
batch_rollups_table = sa.Table(
    "upsert_batch_rollups",
    metadata,
    sa.Column("shard_id", sa.String(128), primary_key=True),
    sa.Column("from_ts", sa.BigInteger, primary_key=True),
    sa.Column("to_ts", sa.BigInteger, nullable=False),
    sa.Column("batches", sa.BigInteger, nullable=False),
    sa.Column("rows_in", sa.BigInteger, nullable=False),
    sa.Column("rows_out", sa.BigInteger, nullable=False),
    sa.Column("rejected", sa.BigInteger, nullable=False),
    sa.Column("first_committed_at", sa.Float, nullable=True),
    sa.Column("last_committed_at", sa.Float, nullable=True),
    sa.Column("rolled_up_at", sa.Float, nullable=False),
)

# Source files set aside in quarantine mode (unparseable names, late arrivals, unreadable
# files), so each is reported once and never silently skipped.
quarantined_files_table = sa.Table(
    "upsert_quarantined_files",
    metadata,
    sa.Column("shard_id", sa.String(128), primary_key=True),
    sa.Column("file", sa.String(2048), primary_key=True),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("ts", sa.BigInteger, nullable=False),
)


# The compacted run of a shard: every batch below ``since`` merged into one run per bucket.
# One row per shard, replaced together with ``since`` by compare-and-set on since (writers
# only move upper, so a compaction never makes a writer lose, nor a writer a compaction).
compactions_table = sa.Table(
    "upsert_compactions",
    metadata,
    sa.Column("shard_id", sa.String(128), primary_key=True),
    sa.Column("since", sa.BigInteger, nullable=False),
    sa.Column("run", sa.Text, nullable=False),
    sa.Column("compacted_at", sa.Float, nullable=False),
)


# Versions of a shard's table schema after the schema of ``init`` (engine/store/table_schemas.py):
# one row per version, inserted once by compare-and-set, never updated. Here because a snapshot
# carries them: a checkpoint restores the schema its runs were written with.
table_schemas_table = sa.Table(
    "upsert_table_schemas",
    metadata,
    sa.Column("shard_id", sa.String(128), primary_key=True),
    sa.Column("version", sa.BigInteger, primary_key=True),
    # The whole schema of this version (Spark StructType JSON), not a diff: a read needs one row.
    sa.Column("schema", sa.Text, nullable=False),
    # What changed from the version before, as JSON (e.g. {"add": [{"name": ..., "type": ...}]}).
    sa.Column("change", sa.Text, nullable=False),
    sa.Column("created_by", sa.String(512), nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
)
