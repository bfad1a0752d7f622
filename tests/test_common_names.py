"""The closest existing shard to an unknown one (pure)."""

from __future__ import annotations

from airflow_upsert_provider.engine.common.names import closest_name, with_closest_shard
from airflow_upsert_provider.engine.errors import ShardNotFound


def test_closest_name_offers_the_likeliest_and_nothing_unlike():
    shards = ["orders", "orders_cdc", "customers", "logs"]
    assert closest_name("ordrs", shards) == "orders"
    assert closest_name("Orders_CDC", shards) == "orders_cdc"
    assert closest_name("costumers", shards) == "customers"
    assert closest_name("zzzz", shards) is None
    assert closest_name("orders", []) is None


def test_unknown_shard_names_the_closest_or_says_the_store_is_empty():
    exc = ShardNotFound("unknown shard 'ordrs' in sqlite:///c.db", shard="ordrs")
    named = with_closest_shard(exc, ["customers", "orders"])
    assert isinstance(named, ShardNotFound)
    assert named.message == "unknown shard 'ordrs' in sqlite:///c.db; did you mean 'orders'?"
    assert named.details == {"shard": "ordrs", "closest": "orders"}
    empty = with_closest_shard(exc, [])
    assert empty.message.endswith("; the consensus store holds no shard") and empty.details["closest"] is None
    # Nothing alike: the message stays as it was.
    assert with_closest_shard(exc, ["zzzz"]) is exc
    # Named once only.
    assert with_closest_shard(named, ["orders", "ordrs2"]) is named
