"""The change feed's rules, pure (engine/table/change_rules.py): which ranges are answerable,
the net change of a key (with and without pre-images), the change retention's bound on since
and its parsing, swept over their parameters; and how the feed finds the changed keys' rows in
a run's batch (engine/table/changes.py), against plain Python."""

from __future__ import annotations

import itertools
import random

import numpy
import pyarrow as pa
import pytest

from airflow_upsert_provider.engine.errors import ConfigurationError, IntegrityError
from airflow_upsert_provider.engine.table.change_rules import (
    CHANGE_TYPES,
    check_changes_range,
    net_change,
    parse_keep,
    range_batches,
    retained_since,
    retention_start,
)
from airflow_upsert_provider.engine.table.changes import (
    _left_join_sorted,
    _strictly_increasing,
    rows_of_keys,
    sorted_positions,
)


def test_a_range_is_answerable_exactly_when_since_le_from_le_to_le_upper():
    for since, upper in itertools.product(range(5), range(5)):
        if since > upper:
            continue
        for from_ts, to_ts in itertools.product(range(7), range(7)):
            ok = since <= from_ts <= to_ts <= upper
            if ok:
                assert check_changes_range("s", from_ts, to_ts, since=since, upper=upper) == (from_ts, to_ts)
                continue
            with pytest.raises(ConfigurationError) as refused:
                check_changes_range("s", from_ts, to_ts, since=since, upper=upper)
            assert f"[{from_ts}, {to_ts})" in refused.value.message
            assert refused.value.details["field"] in ("from_ts", "to_ts")
            if from_ts < since and from_ts <= to_ts <= upper:
                assert refused.value.details["since"] == since
                assert "--keep" in refused.value.message


@pytest.mark.parametrize("bad", [-1, 1.0, "1", None, True])
def test_a_ts_that_is_not_a_whole_number_is_refused_naming_it(bad):
    with pytest.raises(ConfigurationError, match="must be a batch ts") as refused:
        check_changes_range("s", bad, 3, since=0, upper=3)
    assert refused.value.details["field"] == "from_ts"


def test_the_net_change_of_every_pair_of_rows():
    rows = [None, {"v": 1}, {"v": 2}]
    for before, after in itertools.product(rows, rows):
        kinds = net_change(before, after)
        assert set(kinds) <= set(CHANGE_TYPES)
        if before == after:
            assert kinds == ()
        elif before is None:
            assert kinds == ("insert",)
        elif after is None:
            assert kinds == ("delete",)
        else:
            assert kinds == ("update_preimage", "update_postimage")


def test_without_preimages_the_net_change_follows_presence_and_whether_a_range_row_won():
    rows = [None, {"v": 1}, {"v": 2}]
    for before, after, rewritten in itertools.product(rows, rows, (False, True)):
        kinds = net_change(before, after, preimages=False, rewritten=rewritten)
        if before is None or after is None:
            # An insert, a delete or nothing: as with pre-images.
            assert kinds == net_change(before, after)
        else:
            # Equal values are not looked at: only whether a row of the range won.
            assert kinds == (("update_postimage",) if rewritten else ())


class Batch:
    def __init__(self, ts: int) -> None:
        self.ts = ts


def test_the_range_s_batches_are_one_per_ts_and_a_gap_is_an_integrity_error():
    batches = [Batch(ts) for ts in (0, 1, 2, 4)]
    assert [b.ts for b in range_batches(batches, 1, 3, "s")] == [1, 2]
    assert range_batches(batches, 2, 2, "s") == []
    with pytest.raises(IntegrityError, match="no batch record for ts 3"):
        range_batches(batches, 1, 5, "s")


def test_the_retention_holds_since_at_the_first_batch_of_its_period():
    rng = random.Random(3)
    for _ in range(3000):
        count = rng.randrange(0, 12)
        times = sorted(rng.uniform(0, 100) for _ in range(count))
        batches = list(enumerate(times))
        now = rng.uniform(50, 150)
        keep = rng.choice([None, rng.uniform(1, 120)])
        target = rng.randrange(0, count + 1)
        since = retained_since(target, batches, now, keep)
        assert since <= target
        if keep is None:
            assert since == target
            continue
        # Every batch of the period stays at or above since; since is the highest such bound.
        within = [ts for ts, at in batches if at >= now - keep]
        assert since == min([target, *within])
        assert all(ts >= since for ts in within)
        assert retention_start(batches, now, keep) == (min(within) if within else None)


@pytest.mark.parametrize("text, seconds", [
    ("7d", 7 * 86400), ("2w", 14 * 86400), ("36h", 36 * 3600), ("90m", 5400), ("3600", 3600), ("1h30m", 5400),
    (" 1D ", 86400), (60, 60),
])
def test_a_retention_period_is_parsed(text, seconds):
    assert parse_keep(text) == seconds


@pytest.mark.parametrize("text", ["", "0", "0d", "7x", "-1d", "d", "1.5d", "nan", None, True, [7]])
def test_a_bad_retention_period_is_refused_naming_the_option(text):
    with pytest.raises(ConfigurationError) as refused:
        parse_keep(text, field="--keep")
    assert refused.value.details["field"] == "--keep" and "--keep" in refused.value.message


def test_sorted_positions_are_every_row_of_a_wanted_key_and_none_when_out_of_order():
    rng = numpy.random.default_rng(3)
    for _ in range(3000):
        column = numpy.sort(rng.integers(-5, int(rng.integers(1, 40)), size=int(rng.integers(0, 30))))
        wanted = numpy.unique(rng.integers(-8, 45, size=int(rng.integers(0, 12))))
        got = sorted_positions(column, wanted)
        assert got is not None and got.tolist() == numpy.flatnonzero(numpy.isin(column, wanted)).tolist()
        if len(numpy.unique(column)) > 1:
            assert sorted_positions(column[::-1].copy(), wanted) is None


def test_rows_of_keys_keeps_the_same_rows_by_binary_search_hash_lookup_or_semi_join():
    rng = numpy.random.default_rng(5)
    for case in range(120):
        ids = numpy.sort(rng.integers(0, 50, size=int(rng.integers(0, 40))))
        if case % 3 == 0:
            rng.shuffle(ids)  # out of order: the hash lookup
        batch = pa.record_batch({"id": pa.array(ids, pa.int64()), "region": pa.array(ids % 3, pa.int64()),
                                 "v": pa.array(numpy.arange(len(ids)), pa.int64())})
        changed = pa.table({"id": pa.array(rng.integers(0, 50, size=int(rng.integers(1, 10))), pa.int64())})
        expected = [r for r in batch.to_pylist() if r["id"] in set(changed.column("id").to_pylist())]
        kept = [r for b in rows_of_keys(iter([batch]), changed, ["id"]) for r in b.to_pylist()]
        assert kept == expected
        as_text = batch.set_column(0, "id", batch.column(0).cast(pa.string()))
        text_changed = changed.set_column(0, "id", changed.column("id").cast(pa.string()))
        kept = [r for b in rows_of_keys(iter([as_text]), text_changed, ["id"]) for r in b.to_pylist()]
        assert [r["v"] for r in kept] == [r["v"] for r in expected]
        # A compound key: (id, id % 3) matches exactly the rows whose id changed.
        compound = changed.append_column("region", pa.array(numpy.array(changed.column("id")) % 3, pa.int64()))
        kept = [r for b in rows_of_keys(iter([batch]), compound, ["id", "region"]) for r in b.to_pylist()]
        assert sorted(r["v"] for r in kept) == [r["v"] for r in expected]


def test_aligning_winners_by_binary_search_gives_the_hash_joins_rows_and_a_key_once_is_its_own_winner():
    rng = numpy.random.default_rng(11)
    for case in range(120):
        after_ids = numpy.unique(rng.integers(-20, 60, size=int(rng.integers(0, 30))))
        before_ids = numpy.sort(rng.choice(after_ids, size=int(rng.integers(0, len(after_ids) + 1)), replace=False))
        after = pa.table({"id": pa.array(after_ids, pa.int64()), "v": pa.array(after_ids * 2, pa.int64())})
        before = pa.table({"id": pa.array(before_ids, pa.int64()), "__from_v": pa.array(before_ids * 3, pa.int64()),
                           "__in_from": pa.array(numpy.ones(len(before_ids), bool))})

        def rows(table: pa.Table) -> list:
            return sorted(table.to_pylist(), key=lambda r: r["id"])

        expected = rows(after.join(before, ["id"], join_type="left outer"))
        assert rows(_left_join_sorted(after, before, ["id"])) == expected
        # Text keys and compound keys take the hash join: the same rows.
        as_text = [t.set_column(0, "id", t.column("id").cast(pa.string())) for t in (after, before)]
        assert rows(_left_join_sorted(*as_text, ["id"])) == rows(as_text[0].join(as_text[1], ["id"], join_type="left outer"))
        ids = before_ids.copy()
        if case % 3 == 1 and ids.size > 1:
            ids[1] = ids[0]  # a key twice: not its own winner
        elif case % 3 == 2 and ids.size > 1:
            ids = ids[::-1].copy()
        table = pa.table({"id": pa.array(ids, pa.int64())})
        assert _strictly_increasing(table, ["id"]) == bool((ids[1:] > ids[:-1]).all())
        assert not _strictly_increasing(table.set_column(0, "id", table.column("id").cast(pa.string())), ["id"])
        assert not _strictly_increasing(table.append_column("r", table.column("id")), ["id", "r"])
