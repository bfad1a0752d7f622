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


def decide_schema_action(
    store_revisions: tuple[str, ...], has_tables: bool, code_head: str, known_revisions: Collection[str]
) -> SchemaAction:
    """The action for a store stamped with ``store_revisions`` (empty: no revision recorded)
    that has tables of ours or not (``has_tables``, the version table aside), given the code's
    head revision and every revision the code knows."""
    if not store_revisions:
        return SchemaAction.UNVERSIONED if has_tables else SchemaAction.CREATE
    if len(store_revisions) > 1 or store_revisions[0] not in known_revisions:
        # Our chain is linear: a second head can only come from code this one does not know.
        return SchemaAction.NEWER
    if store_revisions[0] == code_head:
        return SchemaAction.CURRENT
    return SchemaAction.UPGRADE


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
    store_revision = ",".join(store_revisions) or None
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
    if action is SchemaAction.NEWER:
        return SchemaVersionMismatch(
            f"consensus store {where} has schema revision {store_revision}, which this provider (schema "
            f"revision {code_head}) does not know: it was upgraded by a newer provider version; upgrade "
            "the provider (airflow-upsert-provider) everywhere the store is used; nothing was changed",
            **details,
        )
    return None
