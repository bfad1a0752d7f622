"""The rules opening a store follows about its schema revision (store/schema_version.py): pure."""

from __future__ import annotations

import pytest

from airflow_upsert_provider.engine.errors import ConfigurationError, SchemaVersionMismatch
from airflow_upsert_provider.engine.store.schema_version import (
    SchemaAction,
    decide_schema_action,
    schema_mismatch,
)

KNOWN = ("0001", "0002", "0003")
HEAD = "0003"
WHERE = "postgresql://upsert:***@db/upsert"


@pytest.mark.parametrize(
    "revisions, has_tables, action",
    [
        ((), False, SchemaAction.CREATE),
        ((), True, SchemaAction.UNVERSIONED),
        (("0003",), True, SchemaAction.CURRENT),
        (("0001",), True, SchemaAction.UPGRADE),
        (("0002",), True, SchemaAction.UPGRADE),
        (("0004",), True, SchemaAction.NEWER),
        (("0004",), False, SchemaAction.NEWER),
        # Two heads: our chain is linear, so only code we do not know wrote them.
        (("0002", "0003"), True, SchemaAction.NEWER),
    ],
)
def test_the_action_follows_from_the_store_revision_and_the_code(revisions, has_tables, action):
    assert decide_schema_action(revisions, has_tables, HEAD, KNOWN) is action


@pytest.mark.parametrize("action", [SchemaAction.CREATE, SchemaAction.CURRENT])
def test_a_fresh_or_current_store_is_used_as_it_is(action):
    assert schema_mismatch(action, ("0003",), HEAD, WHERE) is None


def test_an_older_store_says_how_to_upgrade_it():
    error = schema_mismatch(SchemaAction.UPGRADE, ("0001",), HEAD, WHERE)
    assert isinstance(error, SchemaVersionMismatch) and isinstance(error, ConfigurationError)
    assert error.exit_code == 2 and not error.retryable
    assert "schema revision 0001, older than this provider's 0003" in error.message
    assert f"`upsertctl db upgrade --conn-id CONN` (an `upsert` connection of {WHERE})" in error.message
    assert "UpgradeConsensusSchemaOperator" in error.message and error.message.endswith("nothing was changed")
    assert error.details == {"store_revision": "0001", "code_revision": "0003", "consensus": WHERE}


def test_a_store_from_before_schema_versions_says_how_to_upgrade_it():
    error = schema_mismatch(SchemaAction.UNVERSIONED, (), HEAD, WHERE)
    assert "created before schema versions (no revision recorded)" in error.message
    assert "upsertctl db upgrade --conn-id" in error.message
    assert error.details["store_revision"] is None and error.details["code_revision"] == "0003"


def test_a_newer_store_is_refused_naming_both_revisions():
    error = schema_mismatch(SchemaAction.NEWER, ("0007",), HEAD, WHERE)
    assert "schema revision 0007, which this provider (schema revision 0003) does not know" in error.message
    assert "upgrade the provider" in error.message and "db upgrade" not in error.message
    assert error.exit_code == 2
