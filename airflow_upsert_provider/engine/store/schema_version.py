"""What opening a consensus store does about its schema version: pure rules.

The store records the revision of its schema (Alembic's, in ``upsert_schema_version``); the
code knows the chain of revisions up to its head. Opening a store compares the two and never
migrates: an upgrade is a step of its own (``upsertctl db upgrade``), run on purpose, never in
the middle of a batch. The effects (reading the revision, creating a fresh store at head,
upgrading) are in store/migrations/.
"""

from __future__ import annotations

import enum
from collections.abc import Collection

from airflow_upsert_provider.engine.errors import SchemaVersionMismatch


class SchemaAction(str, enum.Enum):
    # No table of ours: create the schema at the code's head and stamp it, in one step.
    CREATE = "create"
    # Stamped with the code's head.
    CURRENT = "current"
    # Stamped with an older revision the code knows: `db upgrade` migrates it.
    UPGRADE = "upgrade"
    # Our tables without a revision (created before schema versions): `db upgrade` stamps it.
    UNVERSIONED = "unversioned"
    # Stamped with a revision the code does not know: written by a newer provider.
    NEWER = "newer"
    # Stamped with several revisions, every one of which the code knows: no provider writes
    # that (the chain is linear and each migration replaces the one row), so the version table
    # was stamped by hand or by a tool, and which revision the tables are at is unknown.
    AMBIGUOUS = "ambiguous"


def decide_schema_action(
    store_revisions: tuple[str, ...], has_tables: bool, code_head: str, known_revisions: Collection[str]
) -> SchemaAction:
    """The action for a store stamped with ``store_revisions`` (empty: no revision recorded)
    that has tables of ours or not (``has_tables``, the version table aside), given the code's
    head revision and every revision the code knows."""
    stamped = set(store_revisions)
    if not stamped:
        return SchemaAction.UNVERSIONED if has_tables else SchemaAction.CREATE
    if not stamped <= set(known_revisions):
        # Written by code this one does not know (a newer chain may well branch).
        return SchemaAction.NEWER
    if len(stamped) > 1:
        return SchemaAction.AMBIGUOUS
    if stamped == {code_head}:
        return SchemaAction.CURRENT
    return SchemaAction.UPGRADE


def stamped_revisions(store_revisions: tuple[str, ...]) -> str | None:
    """The revisions a store is stamped with as messages and ``db status`` show them: sorted,
    comma-separated (the table's rows come back in no set order); None when there is none."""
    return ",".join(sorted(set(store_revisions))) or None


def upgrade_command(where: str) -> str:
    """How to upgrade the store at ``where`` (a URL with its password hidden): the store named
    by a connection or the environment, never by a password on a command line (``ps`` shows it)."""
    return (f"upsertctl db upgrade --conn-id CONN` (an `upsert` connection of {where}), or "
            "`UPSERT_CONSENSUS_URL=<url> upsertctl db upgrade")


def schema_mismatch(
    action: SchemaAction, store_revisions: tuple[str, ...], code_head: str, where: str
) -> SchemaVersionMismatch | None:
    """The error opening a store refuses with, or None when the store may be used as it is
    (CREATE and CURRENT). ``where`` is the store's URL with its password hidden."""
    store_revision = stamped_revisions(store_revisions)
    details = {"store_revision": store_revision, "code_revision": code_head, "consensus": where}
    how = (
        f"run `{upgrade_command(where)}` with this provider version installed (from Airflow: a task of "
        "UpgradeConsensusSchemaOperator on the connection), after stopping the writers of the store's shards "
        "(docs/upgrading.md)"
    )
    if action is SchemaAction.UPGRADE:
        return SchemaVersionMismatch(
            f"consensus store {where} has schema revision {store_revision}, older than this provider's "
            f"{code_head}: {how}; nothing was changed",
            **details,
        )
    if action is SchemaAction.UNVERSIONED:
        return SchemaVersionMismatch(
            f"consensus store {where} was created before schema versions (no revision recorded), this "
            f"provider needs revision {code_head}: {how}; nothing was changed",
            **details,
        )
    if action is SchemaAction.AMBIGUOUS:
        return SchemaVersionMismatch(
            f"consensus store {where} has several schema revisions stamped ({store_revision}) in its "
            "version table upsert_schema_version, which holds exactly one (this provider's revisions form "
            "one chain and no provider version stamps two): it was stamped by hand or by a tool, and which "
            "revision its tables are at is unknown. Keep only the row of the revision the tables were "
            f"migrated to, then run `upsertctl db status` (this provider's revision is {code_head}); if that "
            "revision is unknown, restore the shards from a checkpoint into a new store; nothing was changed",
            **details,
        )
    if action is SchemaAction.NEWER:
        return SchemaVersionMismatch(
            f"consensus store {where} has schema revision {store_revision}, which this provider (schema "
            f"revision {code_head}) does not know: it was upgraded by a newer provider version; upgrade "
            "the provider (airflow-upsert-provider) everywhere the store is used; nothing was changed",
            **details,
        )
    return None
