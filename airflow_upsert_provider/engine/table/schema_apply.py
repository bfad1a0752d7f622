"""Schema evolution applied by a batch: the thin shell around the pure rules of
engine/table/schema_evolution.py.

For one batch, :func:`evolve_batch` turns the fields the batch's records carry into an
:class:`Evolution` under the shard's policy, and when that makes a new schema, mints it as the
next version by compare-and-set (engine/store/table_schemas.py) before anything of the batch is
written. Writers racing through one batch observe the same fields and plan the same schema, so
they converge on one version; any other move of the version is :class:`SchemaVersionConflict`.
"""

from __future__ import annotations

from collections.abc import Sequence

from airflow_upsert_provider.engine.store.schema_policies import store_schema_policy, stored_schema_policy
from airflow_upsert_provider.engine.store.table_schemas import config_at, mint_schema_version
from airflow_upsert_provider.engine.table.schema_evolution import (
    DEFAULT_POLICY,
    Evolution,
    ObservedField,
    check_policy,
    effective_policy,
    evolve,
)
from airflow_upsert_provider.engine.table.shard import Shard

__all__ = ["DEFAULT_POLICY", "evolve_batch", "schema_policy", "set_schema_policy"]


def schema_policy(shard: Shard) -> str:
    """The schema evolution policy of ``shard`` (:func:`effective_policy` of what is stored)."""
    return effective_policy(stored_schema_policy(shard.consensus, shard.shard_id))


def set_schema_policy(shard: Shard, policy: str, changed_by: str) -> str:
    """Set the schema evolution policy of ``shard`` (checked: an unknown one is
    :class:`ConfigurationError` naming the choices); the policy now."""
    store_schema_policy(shard.consensus, shard.shard_id, check_policy(policy), changed_by)
    return policy


def evolve_batch(shard: Shard, observed: Sequence[ObservedField], *, ts: int) -> Evolution:
    """What batch ``ts``, whose records carry the top-level fields ``observed``, does to the
    table's schema under the shard's policy, made durable before the batch writes anything.

    Reads the schema's newest version into ``shard.config``; when the evolution makes a new
    schema, mints it as the next version (compare-and-set: a writer that lost the race finds
    the same schema and takes that version; any other outcome is
    :class:`SchemaVersionConflict`) and takes it into ``shard.config``, so the batch is
    validated and written with it. A refusal (:class:`BatchSchemaRefused`) changes nothing."""
    config = shard.refresh_schema()
    evolution = evolve(
        config.schema, observed, schema_policy(shard), keys=config.keys, order_by=config.order_by,
        shard_id=shard.shard_id,
    )
    if evolution.schema is None:
        return evolution
    minted = mint_schema_version(
        shard.consensus, shard.shard_id, config.schema_version, evolution.schema, evolution.change(),
        created_by=f"batch ts={ts}",
    )
    shard.config = config_at(shard.config, minted)
    return evolution
