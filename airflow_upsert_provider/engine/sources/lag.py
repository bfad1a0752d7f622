"""The unit a source's lag is counted in, and a lag as people read it ("12 segments").

A Kafka offset is one record: a Kafka shard's lag is the records after the offsets bound at
its upper. A directory source's offset is a segment file, and its records are not known
before the file is read (counting the lines of every pending file at every look would read
the whole backlog each time): its lag is the segment files not yet bound, never an estimate
of records. Observations recorded before the unit was kept counted the distance between
offsets (for a directory, between file numbers): their unit is "offsets".
"""

from __future__ import annotations

RECORDS = "records"
SEGMENTS = "segments"
OFFSETS = "offsets"
LAG_UNITS = (RECORDS, SEGMENTS, OFFSETS)

_ONE = {RECORDS: "record", SEGMENTS: "segment", OFFSETS: "offset"}


def format_lag(amount: int | None, unit: str) -> str:
    """``75,000 records``, ``1 segment``; ``unknown`` for no amount."""
    if amount is None:
        return "unknown"
    return f"{amount:,} {_ONE.get(unit, unit) if amount == 1 else unit}"


def format_pending(amount: int | None, unit: str | None, seconds: float | None) -> str:
    """What is pending and how long the oldest of it has waited, as logs, pages and
    ``upsertctl`` say it: ``12 segments pending, the oldest for 2m40s``; ``nothing pending``;
    ``lag unknown`` (no observation)."""
    # Imported here: the sources' modules run on Spark executors too, which need no pendulum.
    from airflow_upsert_provider.engine.common.time_text import format_duration_to_the_second

    if amount is None:
        return "lag unknown"
    if amount == 0:
        return "nothing pending"
    text = f"{format_lag(amount, unit or OFFSETS)} pending"
    if seconds is not None:
        text += f", the oldest for {format_duration_to_the_second(seconds)}"
    return text
