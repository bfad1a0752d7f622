"""The closest existing name to one that was mistyped: "unknown shard 'ordrs'" names 'orders'."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from airflow_upsert_provider.engine.errors import ShardNotFound

# How alike two names must be to be offered (difflib's ratio): 'ordrs' for 'orders', not 'logs'.
SIMILARITY = 0.6


def closest_name(name: str, candidates: Iterable[str]) -> str | None:
    """The candidate most like ``name`` (case-insensitively), None when none is alike enough."""
    by_folded: dict[str, str] = {}
    for candidate in candidates:
        by_folded.setdefault(candidate.lower(), candidate)
    found = difflib.get_close_matches(name.lower(), list(by_folded), n=1, cutoff=SIMILARITY)
    return by_folded[found[0]] if found else None


def with_closest_shard(exc: ShardNotFound, shard_ids: Iterable[str]) -> ShardNotFound:
    """``exc`` with the closest existing shard named in its message (and ``closest`` in its
    details), or saying that the store holds no shard; ``exc`` itself when it names no shard
    or none is alike."""
    shard_id = exc.details.get("shard")
    if not isinstance(shard_id, str) or "closest" in exc.details:
        return exc
    existing = [s for s in shard_ids if s != shard_id]
    if not existing:
        hint = "the consensus store holds no shard"
    else:
        closest = closest_name(shard_id, existing)
        if closest is None:
            return exc
        hint = f"did you mean {closest!r}?"
    named = ShardNotFound(f"{exc.message}; {hint}", **exc.details,
                          closest=closest_name(shard_id, existing) if existing else None)
    named.retryable = exc.retryable
    return named
