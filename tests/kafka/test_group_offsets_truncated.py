"""The Kafka group's "behind since" over a truncated history: floored at the oldest batch
kept, never "not behind". On a real consensus store, every group position and every
truncation point of a history."""

from __future__ import annotations

import time

import sqlalchemy as sa

from airflow_upsert_provider.engine.lifecycle.group_offsets import first_ts_past, group_behind_since
from airflow_upsert_provider.engine.store.consensus import Consensus
from airflow_upsert_provider.engine.store.tables import batches_table
from airflow_upsert_provider.engine.store.history import truncate_history
from tests.kafka.test_group_offsets import KafkaShard, commit_batches

TOS = [{"0": 3, "1": 0}, {"0": 3, "1": 4}, {"0": 3, "1": 4}, {"0": 9, "1": 4}, {"0": 9, "1": 8},
       {"0": 12, "1": 8}, {"0": 12, "1": 8}, {"0": 15, "1": 9}]


def test_first_ts_past_is_the_first_true_of_a_monotone_predicate():
    for high in range(12):
        for flip in range(high + 1):
            for low in range(flip + 1):
                asked = []
                assert first_ts_past(low, high, lambda ts: asked.append(ts) or ts >= flip) == flip
                assert all(low <= ts <= high for ts in asked)


def test_behind_since_is_floored_at_the_oldest_batch_kept(consensus: Consensus) -> None:
    commit_batches(consensus, "s", TOS)
    # Distinct commit times, one per ts.
    with consensus.engine.begin() as conn:
        conn.execute(sa.update(batches_table).values(committed_at=1000.0 + batches_table.c.ts * 10))
    committed_at = {ts: 1000.0 + ts * 10 for ts in range(len(TOS))}
    shard = KafkaShard(consensus, "s", source=None, group_id="g")  # type: ignore[arg-type]
    groups = [{}] + TOS + [{"0": 99, "1": 99}]
    expected_full = {}
    for index, group in enumerate(groups):
        first = next((t for t in range(len(TOS)) if any(TOS[t][p] > group.get(p, 0) for p in TOS[t])), None)
        expected_full[index] = first
        assert group_behind_since(shard, group) == (None if first is None else committed_at[first])

    since = 0
    for new_since in range(2, len(TOS) + 1):
        assert consensus.compare_and_set_since("s", since, new_since, {"path": f"x/c{new_since}", "files": []})
        since = new_since
        truncate_history(consensus, "s", committed_before=time.time() + 60, source_partitions=None)
        oldest = since - 1  # what truncation keeps: binding and batch since - 1 and above
        assert consensus.get_binding("s", oldest - 1) is None and consensus.get_batch("s", oldest) is not None
        for index, group in enumerate(groups):
            first = expected_full[index]
            want = None if first is None else committed_at[max(first, oldest)]
            assert group_behind_since(shard, group) == want, (since, group)


class TruncatedBeforeItsBatchIsRead:
    """The consensus store, but the first batch look-up runs a truncation first: GC truncated
    the history between the search over the bindings and the read of the batch it found."""

    def __init__(self, consensus: Consensus) -> None:
        self._consensus = consensus
        self.truncated = False

    def __getattr__(self, name: str):
        return getattr(self._consensus, name)

    def get_batch(self, shard_id: str, ts: int):
        if not self.truncated:
            self.truncated = True
            truncate_history(self._consensus, shard_id, committed_before=time.time() + 60, source_partitions=None)
        return self._consensus.get_batch(shard_id, ts)


def test_a_truncation_during_the_search_still_dates_the_gap_never_not_behind(consensus: Consensus) -> None:
    commit_batches(consensus, "s", TOS)
    with consensus.engine.begin() as conn:
        conn.execute(sa.update(batches_table).values(committed_at=1000.0 + batches_table.c.ts * 10))
    assert consensus.compare_and_set_since("s", 0, 6, {"path": "x/c6", "files": []})
    racing = TruncatedBeforeItsBatchIsRead(consensus)
    shard = KafkaShard(racing, "s", source=None, group_id="g")  # type: ignore[arg-type]
    # The group never committed: behind since batch 0, whose row the truncation took; the
    # first row kept, batch 5, floors it.
    assert group_behind_since(shard, {}) == 1050.0
    assert racing.truncated and consensus.get_batch("s", 0) is None
