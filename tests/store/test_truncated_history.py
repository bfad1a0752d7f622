"""Truncated history never accuses a good file: below the truncation horizon a file is
"truncated" (settled), never "unbound" (a late arrival). Pure: the decision over every
binding history of a seeded sweep and every truncation point of it."""

from __future__ import annotations

import random

from airflow_upsert_provider.engine.sources.directory import Segment
from airflow_upsert_provider.engine.sources.planning import put_back_reason, range_to
from airflow_upsert_provider.engine.store.records import Binding
from airflow_upsert_provider.engine.store.history import truncation_horizon

EXT = ".jsonl"


def history(rng: random.Random, batches: int) -> tuple[list[Binding], dict[str, dict[int, str]]]:
    """Contiguous bindings of partitions that may start late, with gaps between offsets and
    padded names; and every bound (offset: name) per partition."""
    starts = {"p0": 0, "p1": rng.randint(0, batches - 1), "p2": rng.randint(0, batches)}
    frontier: dict[str, int] = {}
    bound: dict[str, dict[int, str]] = {p: {} for p in starts}
    bindings = []
    for ts in range(batches):
        ranges = {}
        for partition, start in starts.items():
            if ts < start:
                continue
            begin = frontier.get(partition, 0)
            offsets, at = [], begin
            for _ in range(rng.randint(0, 3)):
                at += rng.choice((0, 1, 1, 5, 10))
                offsets.append(at)
                at += 1
            names = [f"{o:020d}{EXT}" if rng.random() < 0.3 else f"{o}{EXT}" for o in offsets]
            bound[partition].update(zip(offsets, names))
            end = offsets[-1] + 1 if offsets else begin
            ranges[partition] = {"from": begin, "to": end, "files": [[o, n] for o, n in zip(offsets, names)]}
            frontier[partition] = end
        bindings.append(Binding(ts=ts, ranges=ranges))
    return bindings, bound


def verdict(bindings: list[Binding], oldest: int, segment: Segment) -> str | None:
    last = bindings[-1]

    def range_at(ts: int):
        assert oldest <= ts <= last.ts, f"asked for binding {ts}, truncated below {oldest}"
        return bindings[ts].ranges.get(segment.partition)

    horizon = truncation_horizon(bindings[oldest]).get(segment.partition, 0)
    frontier = range_to(last.ranges.get(segment.partition))
    return put_back_reason(segment, frontier, horizon, oldest, last.ts, range_at, EXT)


def test_below_the_horizon_truncated_never_unbound_and_above_it_the_full_history_answers():
    checked = {"truncated": 0, "put_back": 0, "late": 0}
    for seed in range(300):
        rng = random.Random(seed)
        bindings, bound = history(rng, rng.randint(1, 8))
        for partition, names in bound.items():
            frontier = range_to(bindings[-1].ranges.get(partition))
            for offset in range(frontier):
                candidates = {f"{offset}{EXT}", f"{offset:05d}{EXT}"} | ({names[offset]} if offset in names else set())
                for name in candidates:
                    segment = Segment(offset, partition, f"/landing/{partition}/{name}")
                    full = verdict(bindings, 0, segment)
                    # Without truncation: a late arrival exactly when that name is not bound there.
                    assert (full is None) == (names.get(offset) == name), (seed, segment, full)
                    for oldest in range(len(bindings)):
                        horizon = truncation_horizon(bindings[oldest]).get(partition, 0)
                        got = verdict(bindings, oldest, segment)
                        if offset < horizon:
                            assert got is None, (seed, oldest, segment, got)
                            checked["truncated"] += 1
                        else:
                            assert got == full, (seed, oldest, segment, got, full)
                            checked["late" if got else "put_back"] += 1
    # The sweep reached every case.
    assert min(checked.values()) > 100, checked


def test_the_horizon_is_the_from_of_the_oldest_binding_kept():
    kept = Binding(ts=7, ranges={"p0": {"from": 40, "to": 50, "files": []}, "p1": {"from": 0, "to": 0, "files": []}})
    assert truncation_horizon(kept) == {"p0": 40, "p1": 0}
    assert truncation_horizon(None) == {}
