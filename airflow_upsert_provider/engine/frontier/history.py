"""Retention of the store's history rows: frontier observations, stream history, alert rows.

What grows with time rather than with the number of shards: observations (a writer records one
per step, a sensor one per poke), every stream transition, and the alert row of a shard id
evaluated once and gone since. ``prune_history`` deletes what its settings no longer keep, in
chunks of at most ``chunk`` rows per table and transaction, so that one call never holds the
store long; ``plan_prune`` (pure) decides what goes.

Kept whatever its age:
- the newest observation of every existing shard (when the shard was last seen: the STALE
  rule's input, and what ``frontier status`` shows of a shard nobody looks at any more);
- the stream history row of a stream's current state (its version): who put it there and why;
- the alert row of every existing shard (its maxima make REWOUND, its streak and ``firing``
  make one page per incident), and of any shard whose page is firing or whose outbox still
  holds pages (the resolve of a gone shard's incident must still go out).

Observations are also pruned per shard on every insert (observations.py); this sweep reaches the
shards nobody records for any more. It runs in the frontier monitor's schedule (docs/frontier.md,
"Retention").
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import sqlalchemy as sa

from airflow_upsert_provider.engine.errors import ConfigurationError
from airflow_upsert_provider.engine.frontier.observations import OBSERVATION_RETENTION_SECONDS
from airflow_upsert_provider.engine.frontier.alerts import AlertState
from airflow_upsert_provider.engine.store.consensus import Consensus
from airflow_upsert_provider.engine.store.tables import shards_table
from airflow_upsert_provider.engine.store.observation_tables import alerts_table, observations_table
from airflow_upsert_provider.engine.store.streams import stream_history_table, streams_table

DAY = 86400.0
# Rows deleted per table and transaction, and chunks per table and call.
CHUNK = 500
MAX_CHUNKS = 20


@dataclass(frozen=True)
class HistoryRetention:
    """How long history rows are kept, in seconds (see the module docstring for what is kept
    whatever its age)."""

    observations_seconds: float = OBSERVATION_RETENTION_SECONDS
    stream_history_seconds: float = 90 * DAY
    alerts_seconds: float = 90 * DAY

    def __post_init__(self) -> None:
        for name in ("observations_seconds", "stream_history_seconds", "alerts_seconds"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ConfigurationError(
                    f"HistoryRetention.{name} must be a positive finite number of seconds (got {value!r})",
                    field=name,
                )


@dataclass(frozen=True)
class HistoryRows:
    """What ``prune_history`` read: rows older than their cutoff (candidates) and what decides
    which of them stay."""

    # (id, shard_id, observed_at)
    observations: Sequence[tuple[int, str, float]] = ()
    # shard -> id of its newest observation, for the candidates' shards that exist
    newest_observation: Mapping[str, int] | None = None
    # (id, shard_id, version, at)
    stream_history: Sequence[tuple[int, str, int, float]] = ()
    # shard -> version of its stream row, for the candidates' shards
    stream_versions: Mapping[str, int] | None = None
    # (shard_id, version, state) of alert rows of shards that do not exist
    orphan_alerts: Sequence[tuple[str, int, AlertState]] = ()


@dataclass(frozen=True)
class HistoryPrune:
    observation_ids: tuple[int, ...] = ()
    stream_history_ids: tuple[int, ...] = ()
    # (shard_id, version): deleted only if still at that version and the shard still absent
    alerts: tuple[tuple[str, int], ...] = ()

    def counts(self) -> dict[str, int]:
        return {"observations": len(self.observation_ids), "stream_history": len(self.stream_history_ids),
                "alerts": len(self.alerts)}


def plan_prune(rows: HistoryRows, retention: HistoryRetention, now: float) -> HistoryPrune:
    """Which of ``rows`` go at ``now``: those older than their retention that nothing keeps."""
    newest = rows.newest_observation or {}
    versions = rows.stream_versions or {}
    observation_cutoff = now - retention.observations_seconds
    stream_cutoff = now - retention.stream_history_seconds
    alert_cutoff = now - retention.alerts_seconds
    observations = tuple(
        row_id for row_id, shard_id, at in rows.observations
        if at < observation_cutoff and newest.get(shard_id) != row_id
    )
    history = tuple(
        row_id for row_id, shard_id, version, at in rows.stream_history
        if at < stream_cutoff and versions.get(shard_id) != version
    )
    alerts = tuple(
        (shard_id, version) for shard_id, version, state in rows.orphan_alerts
        if not state.firing and not state.outbox
        and (state.last_evaluated_at is None or state.last_evaluated_at < alert_cutoff)
    )
    return HistoryPrune(observations, history, alerts)


def prune_history(
    consensus: Consensus, retention: HistoryRetention | None = None, *, now: float | None = None,
    chunk: int = CHUNK, max_chunks: int = MAX_CHUNKS,
) -> dict[str, int]:
    """Delete the history rows ``retention`` no longer keeps, at most ``chunk`` per table in each
    short transaction and ``max_chunks`` transactions per call (the next call goes on); the
    rows deleted per table. Reads run in read transactions, deletes in their own: no lock is
    held while deciding."""
    retention = retention or HistoryRetention()
    now = time.time() if now is None else float(now)
    deleted = {"observations": 0, "stream_history": 0, "alerts": 0}
    # Where each table's next read starts: rows kept whatever their age are passed over, not
    # read again by every chunk.
    cursor = _Cursor()
    for _ in range(max_chunks):
        rows = consensus.read_in_snapshot(lambda conn: _read_rows(conn, retention, now, chunk, cursor))
        if not (rows.observations or rows.stream_history or rows.orphan_alerts):
            break
        plan = plan_prune(rows, retention, now)
        if any(plan.counts().values()):
            consensus.run_in_transaction(lambda conn: _delete(conn, plan))
        for name, count in plan.counts().items():
            deleted[name] += count
        cursor = _Cursor(
            max((r[0] for r in rows.observations), default=cursor.observation_id),
            max((r[0] for r in rows.stream_history), default=cursor.stream_history_id),
            max((r[0] for r in rows.orphan_alerts), default=cursor.alert_shard),
        )
    return deleted


@dataclass(frozen=True)
class _Cursor:
    observation_id: int = -1
    stream_history_id: int = -1
    alert_shard: str = ""


def _read_rows(conn, retention: HistoryRetention, now: float, chunk: int, cursor: _Cursor) -> HistoryRows:
    obs, hist = observations_table, stream_history_table
    observation_rows = [tuple(r) for r in conn.execute(
        sa.select(obs.c.id, obs.c.shard_id, obs.c.observed_at)
        .where(obs.c.observed_at < now - retention.observations_seconds, obs.c.id > cursor.observation_id)
        .order_by(obs.c.id).limit(chunk)
    )]
    shards = sorted({r[1] for r in observation_rows})
    existing = set(conn.execute(
        sa.select(shards_table.c.shard_id).where(shards_table.c.shard_id.in_(shards))
    ).scalars()) if shards else set()
    newest = {
        shard_id: conn.execute(
            sa.select(obs.c.id).where(obs.c.shard_id == shard_id)
            .order_by(obs.c.observed_at.desc(), obs.c.id.desc()).limit(1)
        ).scalar_one()
        for shard_id in sorted(existing)
    }
    history_rows = [tuple(r) for r in conn.execute(
        sa.select(hist.c.id, hist.c.shard_id, hist.c.version, hist.c.at)
        .where(hist.c.at < now - retention.stream_history_seconds, hist.c.id > cursor.stream_history_id)
        .order_by(hist.c.id).limit(chunk)
    )]
    streams = sorted({r[1] for r in history_rows})
    versions = dict(conn.execute(
        sa.select(streams_table.c.shard_id, streams_table.c.version).where(streams_table.c.shard_id.in_(streams))
    ).all()) if streams else {}
    orphans = [
        (r.shard_id, int(r.version), AlertState.from_dict(json.loads(r.state)))
        for r in conn.execute(
            sa.select(alerts_table.c.shard_id, alerts_table.c.version, alerts_table.c.state)
            .where(alerts_table.c.shard_id > cursor.alert_shard,
                   alerts_table.c.shard_id.not_in(sa.select(shards_table.c.shard_id)))
            .order_by(alerts_table.c.shard_id).limit(chunk)
        )
    ]
    return HistoryRows(observation_rows, newest, history_rows, versions, orphans)


def _delete(conn, plan: HistoryPrune) -> None:
    if plan.observation_ids:
        conn.execute(sa.delete(observations_table).where(observations_table.c.id.in_(plan.observation_ids)))
    if plan.stream_history_ids:
        conn.execute(sa.delete(stream_history_table).where(stream_history_table.c.id.in_(plan.stream_history_ids)))
    for shard_id, version in plan.alerts:
        # A shard created again under that id since the read keeps its row.
        conn.execute(sa.delete(alerts_table).where(
            alerts_table.c.shard_id == shard_id, alerts_table.c.version == version,
            ~sa.exists().where(shards_table.c.shard_id == shard_id),
        ))


def describe(deleted: Mapping[str, Any]) -> str:
    return ", ".join(f"{count} {name.replace('_', ' ')} row(s)" for name, count in deleted.items())
