"""The one list of what a consensus store creates and enforces, and the way to open a store.

Every table and every commit/restore hook is named here and handed to the store when it is
opened: nothing joins a store by being imported.
"""

from __future__ import annotations

from airflow_upsert_provider.engine.store.catalog_lock import catalog_locks_table
from airflow_upsert_provider.engine.store.catalog_rows import catalog_entries_table, catalogs_table
from airflow_upsert_provider.engine.store.change_feed import change_cursors_table, change_retention_table
from airflow_upsert_provider.engine.store.checkpoint_refs import checkpoint_refs_table
from airflow_upsert_provider.engine.store.consensus import Consensus
from airflow_upsert_provider.engine.store.engines import open_store
from airflow_upsert_provider.engine.store.records import StoreSchema
from airflow_upsert_provider.engine.store.schema_policies import schema_policies_table
from airflow_upsert_provider.engine.store.tables import (
    batch_rollups_table,
    batches_table,
    bindings_table,
    compactions_table,
    quarantined_files_table,
    shards_table,
    table_schemas_table,
)
from airflow_upsert_provider.engine.store.migrations import prepare_on_open, refuse_other_revision
from airflow_upsert_provider.engine.store.gc_claims import (
    blob_owners_table,
    gc_claims_table,
    refuse_claimed,
    replaced_runs_table,
    take_ownership,
)
from airflow_upsert_provider.engine.store.observation_tables import alerts_table, observations_table
from airflow_upsert_provider.engine.store.source_index import settled_names_table
from airflow_upsert_provider.engine.store.streams import fence_commit, start_recovering, stream_history_table, streams_table

STORE_SCHEMA = StoreSchema(
    tables=(
        shards_table,
        bindings_table,
        batches_table,
        batch_rollups_table,
        quarantined_files_table,
        compactions_table,
        catalog_locks_table,
        catalogs_table,
        catalog_entries_table,
        checkpoint_refs_table,
        gc_claims_table,
        replaced_runs_table,
        blob_owners_table,
        settled_names_table,
        streams_table,
        stream_history_table,
        observations_table,
        alerts_table,
        change_retention_table,
        change_cursors_table,
        table_schemas_table,
        schema_policies_table,
    ),
    # Run in this order: the schema revision (a store upgraded underneath this process), the
    # GC claim check, then the stream fence.
    commit_hooks=(refuse_other_revision, refuse_claimed, fence_commit),
    # A restored shard gets a new blob generation, and its stream starts RECOVERING in a new
    # epoch.
    restore_hooks=(take_ownership, start_recovering),
)


def open_consensus(url: str, *, create: bool = True, check_schema: bool = True) -> Consensus:
    """Open the consensus store at ``url``: ``sqlite:///path.db`` or
    ``postgresql://user:pass@host:port/db``.

    Its schema revision is checked against the code's (one read of the version row): a store
    without tables of ours is created at the head when ``create``; a store at an older or newer
    revision is refused with :class:`SchemaVersionMismatch`, nothing changed. Only ``db
    upgrade``/``db status`` open with ``check_schema=False``, to act on such a store."""
    consensus = open_store(url, STORE_SCHEMA)
    if check_schema:
        try:
            prepare_on_open(consensus, create=create)
        except BaseException:
            consensus.dispose()
            raise
    return consensus
