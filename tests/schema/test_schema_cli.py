"""``upsertctl schema``: the versions of a shard's schema and ``add-column`` (exit codes of
docs/errors.md). In this process, no Spark (the types given parse without a JVM)."""

from __future__ import annotations

import json

from tests.helpers import Upsertctl, make_shard
from tests.conftest import sqlite_only


@sqlite_only
def test_schema_shows_the_versions_and_add_column_adds_one_or_refuses_naming_the_column(
    consensus, consensus_url, blob, tmp_path, capsys
):
    make_shard(consensus, blob, tmp_path)
    upsertctl = Upsertctl(capsys, consensus_url, blob.root)

    shown = json.loads(upsertctl.ok("schema", "orders", "--json"))
    assert shown["version"] == 1 and [v["version"] for v in shown["versions"]] == [1]

    out = upsertctl.ok("schema", "add-column", "orders", "discount", "DECIMAL(10,2)", "--actor", "ops")
    assert out.strip() == "shard orders: column discount DECIMAL(10,2) added; schema version 2"
    again = json.loads(upsertctl.ok("schema", "add-column", "orders", "discount", "DECIMAL(10,2)", "--json"))
    assert (again["added"], again["version"]) == (False, 2)

    human = upsertctl.ok("schema", "show", "orders")
    assert "v2  {\"add\": [{\"name\": \"discount\", \"type\": \"decimal(10,2)\"}]} by ops at " in human
    assert "DISCOUNT DECIMAL(10,2)" in human.upper() and human.rstrip().endswith("shard orders: schema version 2, schema evolution add_columns")

    # Another type under a name the table has (case-insensitively): exit 2, naming both types.
    code, out, err = upsertctl("schema", "add-column", "orders", "Discount", "BIGINT", "--json")
    refusal = json.loads(out)
    assert code == 2 and refusal["error"] == "SchemaChangeRefused"
    assert (refusal["column"], refusal["old_type"], refusal["new_type"]) == ("Discount", "decimal(10,2)", "long")
    assert "add a column of another name" in err
    code, out, err = upsertctl("schema", "add-column", "orders", "_ts", "BIGINT")
    assert code == 2 and "reserved by the engine" in err
    code, out, err = upsertctl("schema", "add-column", "orders", "tax", "DOUBLE NOT NULL")
    assert code == 2 and "a new column is nullable" in err
    code, out, err = upsertctl("schema", "add-column", "orders", "tax")
    assert code == 2 and "usage: upsertctl schema" in err
    code, out, err = upsertctl("schema", "ordrs")
    assert code == 2 and "unknown shard 'ordrs'" in err
    # Nothing of the refusals was recorded.
    assert [v["version"] for v in json.loads(upsertctl.ok("schema", "orders", "--json"))["versions"]] == [1, 2]
