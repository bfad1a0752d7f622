"""The rules opening a store follows about its schema revision (store/schema_version.py): pure."""

from __future__ import annotations

import itertools
import random

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
        # Two revisions this code knows: stamped by hand, not by a newer provider.
        (("0002", "0003"), True, SchemaAction.AMBIGUOUS),
        (("0002", "0004"), True, SchemaAction.NEWER),
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


# Revisions a store may be stamped with: every revision of the chain, and two no code here knows.
STAMPS = KNOWN + ("0004", "ffff")


def _stamp_sets():
    """Every set of up to three stamps from STAMPS, each in every order (a table has no order)."""
    for size in range(4):
        for combination in itertools.combinations(STAMPS, size):
            yield from itertools.permutations(combination)


def test_the_action_over_every_stamp_set_and_every_code_head():
    # Each head is a release: it knows the chain up to itself.
    for position, head in enumerate(KNOWN):
        known = KNOWN[: position + 1]
        for stamps in _stamp_sets():
            for has_tables in (False, True):
                action = decide_schema_action(stamps, has_tables, head, known)
                unknown = set(stamps) - set(known)
                case = (stamps, has_tables, head)
                # "newer" exactly when some stamp is a revision this code does not know.
                assert (action is SchemaAction.NEWER) == bool(unknown), case
                # Several stamps the code knows: ambiguous, never newer, never usable.
                assert (action is SchemaAction.AMBIGUOUS) == (not unknown and len(set(stamps)) > 1), case
                # Usable as it is only when stamped with exactly the head.
                assert (action is SchemaAction.CURRENT) == (tuple(stamps) == (head,)), case
                assert (action is SchemaAction.UPGRADE) == (len(stamps) == 1 and not unknown and stamps[0] != head), case
                if not stamps:
                    assert action is (SchemaAction.UNVERSIONED if has_tables else SchemaAction.CREATE), case
                # The order rows come back in does not matter.
                assert decide_schema_action(tuple(reversed(stamps)), has_tables, head, known) is action, case


def test_a_stamp_repeated_is_read_as_that_one_stamp():
    # The version table's key forbids it; a copy of the table without the key must not change the answer.
    rng = random.Random(20261127)
    for _ in range(300):
        stamps = tuple(rng.choice(STAMPS) for _ in range(rng.randint(1, 3)))
        repeated = stamps + tuple(rng.choice(stamps) for _ in range(rng.randint(1, 3)))
        assert decide_schema_action(repeated, True, HEAD, KNOWN) is decide_schema_action(stamps, True, HEAD, KNOWN)


def test_a_doubly_stamped_store_is_refused_as_stamped_by_hand_not_as_newer():
    error = schema_mismatch(SchemaAction.AMBIGUOUS, ("0002", "0003"), HEAD, WHERE)
    assert isinstance(error, SchemaVersionMismatch) and error.exit_code == 2 and not error.retryable
    assert "several schema revisions stamped (0002,0003)" in error.message
    assert "stamped by hand or by a tool" in error.message and "upsert_schema_version" in error.message
    assert "newer" not in error.message and "upgrade the provider" not in error.message
    assert error.message.endswith("nothing was changed")
    assert error.details == {"store_revision": "0002,0003", "code_revision": "0003", "consensus": WHERE}
    # Rows come back in no set order: the message does not depend on it.
    assert schema_mismatch(SchemaAction.AMBIGUOUS, ("0003", "0002"), HEAD, WHERE).message == error.message
