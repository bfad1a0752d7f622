"""Frontier observations and the alert state of every shard, in consensus (invariant 15).

An observation is what one look at a shard saw: its upper, when the last batch committed, the
source's high watermark, the offsets bound at the upper, how far behind that is (in the source's
unit: records for Kafka, segment files for a directory; and seconds from the landing time of the
oldest record not yet committed) and the stream status.
Writers record one after every step, sensors and ``upsertctl frontier observe`` one per look:
a stall shows as a series of observations whose upper does not move while the source grows.

Two tables: ``upsert_frontier_observations`` (one row per observation, pruned per shard by age
and count on every insert, by index range: no scan of the table) and ``upsert_frontier_alerts``
(one row per shard: the evaluation state as JSON and a version). An evaluation round reads the
window, asks the pure rules of ``engine/frontier/rules.py`` what the status is and those of
``engine/frontier/alerts.py`` whether to page, and writes the new state by compare-and-set on the version: of two evaluators racing, one
writes; the other re-reads, and returns no page action, so a stall is paged once.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import sqlalchemy as sa

from airflow_upsert_provider.engine.common.retry import CAS_CONTENTION
from airflow_upsert_provider.engine.store.consensus import Consensus, insert_ignore, shard_exists
from airflow_upsert_provider.engine.store.observation_tables import alerts_table, observations_table
from airflow_upsert_provider.engine.frontier.alerts import (
    MAX_OUTBOX,
    AlertState,
    advance_alert,
    enqueue_page,
    settle_pages,
    take_pages,
)
from airflow_upsert_provider.engine.frontier.blind import BlindState, blind_page_event
from airflow_upsert_provider.engine.frontier.model import Evaluation, Observation, StallSettings, partition_lag_summary
from airflow_upsert_provider.engine.frontier.pages import page_event
from airflow_upsert_provider.engine.frontier.rules import evaluate

if TYPE_CHECKING:
    from airflow_upsert_provider.engine.blob.interface import Blob
    from airflow_upsert_provider.engine.table.shard import Shard, ShardStatus

log = logging.getLogger(__name__)

# Observations of a shard older than this are deleted when the next one is recorded.
OBSERVATION_RETENTION_SECONDS = 24 * 3600.0
# At most this many observations are kept per shard (the newest).
MAX_OBSERVATIONS_PER_SHARD = 2000
# Fresh reads and decisions an evaluation makes when other evaluators keep beating its
# compare-and-set, before it gives up writing (it then returns no page action).
MAX_CAS_ATTEMPTS = CAS_CONTENTION.max_attempts

# Called between an evaluation's load of the alert state and its compare-and-set, with the
# shard id, the state read and its version: tests land a concurrent evaluator exactly there.
between_load_and_save: Callable[[str, AlertState, int], None] | None = None


# -- observing ----------------------------------------------------------------------------------


def observe(
    shard: "Shard",
    *,
    observer: str,
    writer_outcome: str | None = None,
    now: float | None = None,
    status: "ShardStatus | None" = None,
) -> Observation:
    """One look at ``shard``, without Spark: ``status`` when the caller has one already (a
    writer computed it for its lag), else a fresh ``shard.status()``."""
    if not observer:
        from airflow_upsert_provider.engine.errors import ConfigurationError

        raise ConfigurationError("an observation needs a non-empty observer", field="observer")
    status = shard.status() if status is None else status
    observed_at = time.time() if now is None else float(now)
    last = shard.consensus.get_batch(shard.shard_id, status.upper - 1) if status.upper > 0 else None
    stream = status.stream or {}
    lag_seconds = status.lag_seconds_at(observed_at)
    return Observation(
        shard_id=shard.shard_id,
        observed_at=observed_at,
        upper=status.upper,
        last_commit_at=None if last is None else float(last.committed_at),
        high_watermark=dict(sorted(status.high_watermark.items())),
        bound=dict(sorted(status.bound.items())),
        stream_status=str(stream.get("status", "READY")),
        stream_changed_at=float(stream.get("changed_at") or 0.0),
        lag=status.lag,
        lag_unit=status.lag_unit,
        lag_seconds=lag_seconds,
        observer=observer,
        writer_outcome=writer_outcome,
        upstream=_upstream(shard, observed_at) if getattr(shard, "is_kafka", False) else None,
        partition_lag=partition_lag_summary(status.pending_by_partition),
    )


# Opens a shard by id with what reaching its source needs (a Kafka shard's client config):
# upsertctl's --kafka-config, the hook's kafka connection. The default opens it without one.
ShardOpener = Callable[[str], "Shard"]


def _opener(consensus: Consensus, blob: "Blob", open_shard: ShardOpener | None) -> ShardOpener:
    if open_shard is not None:
        return open_shard
    from airflow_upsert_provider.engine.table.shard import Shard

    return lambda shard_id: Shard.open(consensus, blob, shard_id)


def _error_text(exc: BaseException, shard: "Shard | None" = None) -> str:
    """One line on why a look failed, with any Kafka secret scrubbed."""
    text = getattr(exc, "message", None) or (str(exc).splitlines() or [""])[0] or type(exc).__name__
    if shard is not None and getattr(shard, "is_kafka", False):
        try:
            text = shard.source.config.scrub(text)
        except Exception:  # no client config to scrub with: the error came before any was used
            pass
    return f"{type(exc).__name__}: {text[:500]}"


def _try_observe(open_shard: ShardOpener, shard_id: str, *, observer: str,
                 now: float) -> tuple[Observation | None, str | None]:
    """An observation of ``shard_id``, or why none could be made (the shard could not be opened,
    its source could not be read): one shard that cannot be observed never hides the others."""
    shard = None
    try:
        shard = open_shard(shard_id)
        return observe(shard, observer=observer, now=now), None
    except Exception as exc:
        error = _error_text(exc, shard)
        log.warning("shard %s: not observable: %s", shard_id, error)
        return None, error


def _upstream(shard: "Shard", now: float) -> dict[str, Any]:
    """The Kafka group against the shard (group_offsets.group_status). An observation is
    never lost to the group: a failure to read it is recorded as {"error": ...} instead."""
    from airflow_upsert_provider.engine.lifecycle.group_offsets import group_status

    try:
        return group_status(shard, now=now)
    except Exception as exc:
        text = getattr(exc, "message", None) or str(exc) or type(exc).__name__
        try:
            text = shard.source.config.scrub(text)
        except Exception:  # no client config to scrub with: the error came before any was used
            pass
        log.warning("shard %s: reading its kafka group for an observation failed: %s", shard.shard_id, text)
        return {"error": f"{type(exc).__name__}: {text}"}


def record_observation(consensus: Consensus, obs: Observation) -> None:
    """Insert ``obs`` and prune its shard's rows older than OBSERVATION_RETENTION_SECONDS
    (before ``obs``) and beyond the newest MAX_OBSERVATIONS_PER_SHARD, in one transaction.
    Both prunes are ranges of the (shard, time) index: the work is bounded by what is
    deleted plus at most MAX_OBSERVATIONS_PER_SHARD index entries, whatever the table holds."""
    consensus.run_in_transaction(lambda conn: _record(conn, obs))


def _record(conn, obs: Observation) -> None:
    table = observations_table
    payload = obs.to_dict()
    # For a provider of an earlier version sharing the store: it requires this field.
    payload["lag_records"] = obs.lag
    conn.execute(sa.insert(table).values(
        shard_id=obs.shard_id, observed_at=obs.observed_at, observer=obs.observer,
        payload=json.dumps(payload, sort_keys=True),
    ))
    mine = table.c.shard_id == obs.shard_id
    conn.execute(sa.delete(table).where(
        mine, table.c.observed_at < obs.observed_at - OBSERVATION_RETENTION_SECONDS,
    ))
    # The oldest row to keep (the window's order: time, then id); every row before it goes.
    oldest_kept = conn.execute(
        sa.select(table.c.observed_at, table.c.id).where(mine)
        .order_by(table.c.observed_at.desc(), table.c.id.desc())
        .offset(MAX_OBSERVATIONS_PER_SHARD - 1).limit(1)
    ).first()
    if oldest_kept is not None:
        at, row_id = oldest_kept
        conn.execute(sa.delete(table).where(mine, sa.or_(
            table.c.observed_at < at, sa.and_(table.c.observed_at == at, table.c.id < row_id),
        )))


def observation_window(
    consensus: Consensus, shard_id: str, start: float, end: float | None = None, *, with_previous: bool = False
) -> list[Observation]:
    """The observations of ``shard_id`` with ``start <= observed_at`` (and ``<= end`` when
    given), oldest first (ties in the order they were recorded). ``with_previous``: the newest
    observation before ``start`` first, if there is one (the rules date a stall that began
    before the window with it)."""
    table = observations_table
    mine = table.c.shard_id == shard_id
    query = sa.select(table.c.payload).where(mine, table.c.observed_at >= start)
    if end is not None:
        query = query.where(table.c.observed_at <= end)
    query = query.order_by(table.c.observed_at, table.c.id)
    previous = (sa.select(table.c.payload).where(mine, table.c.observed_at < start)
                .order_by(table.c.observed_at.desc(), table.c.id.desc()).limit(1))

    def read(conn) -> list[str]:
        rows = list(conn.execute(previous).scalars().all()) if with_previous else []
        return rows + list(conn.execute(query).scalars().all())

    rows = consensus.read_in_snapshot(read)
    return [Observation.from_dict(json.loads(payload)) for payload in rows]


def judging_window(consensus: Consensus, shard_id: str, settings: StallSettings, now: float) -> list[Observation]:
    """What ``rules.evaluate`` judges ``shard_id`` on at ``now``: the window and the look before it."""
    return observation_window(consensus, shard_id, now - settings.window_seconds, now, with_previous=True)


def observation_count(consensus: Consensus, shard_id: str) -> int:
    table = observations_table
    return int(consensus.read_in_snapshot(lambda conn: conn.execute(
        sa.select(sa.func.count()).select_from(table).where(table.c.shard_id == shard_id)
    ).scalar()))


# -- the alert state ----------------------------------------------------------------------------


def load_alert_state(consensus: Consensus, shard_id: str) -> tuple[AlertState, int]:
    """The stored alert state of ``shard_id`` and its version; a fresh state, version 0, when
    none was ever saved."""
    row = consensus.read_in_snapshot(lambda conn: conn.execute(
        sa.select(alerts_table.c.version, alerts_table.c.state).where(alerts_table.c.shard_id == shard_id)
    ).first())
    if row is None:
        return AlertState(shard_id=shard_id), 0
    return AlertState.from_dict(json.loads(row.state)), int(row.version)


def save_alert_state(consensus: Consensus, state: AlertState, expected_version: int) -> bool:
    """Write ``state`` iff the stored version is still ``expected_version`` (0: no row yet);
    the new version is ``expected_version + 1``. True if written, False if another writer
    moved it first (nothing written)."""
    if expected_version < 0:
        from airflow_upsert_provider.engine.errors import ConfigurationError

        raise ConfigurationError("expected_version must be >= 0", field="expected_version")
    return bool(consensus.run_in_transaction(lambda conn: _save(conn, state, expected_version)))


def _save(conn, state: AlertState, expected_version: int) -> bool:
    text = json.dumps(state.to_dict(), sort_keys=True)
    if expected_version == 0:
        return insert_ignore(conn, alerts_table, shard_id=state.shard_id, version=1, state=text)
    updated = conn.execute(
        sa.update(alerts_table)
        .where(alerts_table.c.shard_id == state.shard_id, alerts_table.c.version == expected_version)
        .values(version=expected_version + 1, state=text)
    ).rowcount
    return updated == 1


# -- evaluation rounds --------------------------------------------------------------------------


@dataclass(frozen=True)
class EvaluationRound:
    """One evaluation of one shard: what the rules decided, the alert state afterwards, the
    page action this round owns ("trigger", "resolve" or None) and the observation it made."""

    evaluation: Evaluation
    state: AlertState
    action: str | None
    observation: Observation | None
    # Why this round could not observe the shard (it then judged the recorded observations).
    observe_error: str | None = None
    # Outbox pages this round took to deliver, oldest first (its own page last, if it made one);
    # each is {"id", "leased_until", "event", "delivered", "taken"}. Confirm each with settle_outbox.
    pages: tuple[dict, ...] = ()
    # The page event of this round's action, as it was put into the outbox (None: no action).
    page: dict | None = None

    @property
    def shard_id(self) -> str:
        return self.evaluation.shard_id

    def to_dict(self) -> dict[str, Any]:
        return {
            "shard": self.evaluation.shard_id,
            "status": _value(self.evaluation.status),
            "action": self.action,
            "evaluation": self.evaluation.to_dict(),
            "state": self.state.to_dict(),
            "observation": None if self.observation is None else self.observation.to_dict(),
            "observe_error": self.observe_error,
        }


def _value(status: Any) -> str:
    return getattr(status, "value", status)


def _shard_exists(consensus: Consensus, shard_id: str) -> bool:
    return consensus.read_in_snapshot(lambda conn: shard_exists(conn, shard_id))


def evaluate_shard(
    consensus: Consensus,
    blob: "Blob",
    shard_id: str,
    settings: StallSettings,
    *,
    observer: str,
    now: float | None = None,
    observe_first: bool = True,
    open_shard: ShardOpener | None = None,
    compose_page: Callable[[Evaluation, AlertState, str], dict] | None = None,
    blind: BlindState | None = None,
    namespace: str = "",
) -> EvaluationRound:
    """One round: observe the shard (if it exists and ``observe_first``), read the window,
    evaluate, advance the alert state, then record the observation and save the state by
    compare-and-set in one transaction.

    When another evaluator saved first: if it evaluated this moment or a later one, its
    decision stands and this round returns the stored state with no action (two sensors never
    both page, and one moment is not counted as two breaches); otherwise this round decides
    again on the fresh state. A shard that does not exist is NOT_FOUND; its alert state is
    written only if one was stored before (a typo leaves no row behind).

    ``open_shard`` opens the shard with what its source needs (a Kafka shard's client config).
    A shard that cannot be observed is judged on the observations recorded so far (writers
    record theirs), with the reason among the evaluation's; with none it is STALE and pages.

    Every trigger or resolve goes into the alert state's outbox, saved with the decision (a
    page marked firing is always a page queued): ``compose_page`` (a sender's: evaluation, new
    state, action -> page event) says what it carries, by default ``pages.page_event``. The
    round takes the due pages of the outbox (``pages``, see ``alerts.take_pages``): a page
    decided by a worker that died before sending it is sent by a later round, once its lease
    ran out. Pages dropped from a full outbox are logged (and counted in the state).

    A round is an evaluation that works: it resolves the monitor's own page for this shard
    ("monitor blind", under ``namespace``) when the caller's failures before it (``blind``) or
    the alert state (a run that paged and then ended) say it is open, through the outbox too."""
    if compose_page is None:
        def compose_page(evaluation: Evaluation, state: AlertState, action: str) -> dict:
            return page_event(evaluation, state, action, settings)

    now = time.time() if now is None else float(now)
    exists = _shard_exists(consensus, shard_id)
    obs = error = None
    if exists and observe_first:
        obs, error = _try_observe(_opener(consensus, blob, open_shard), shard_id, observer=observer, now=now)
    window = judging_window(consensus, shard_id, settings, now) if exists else []
    if obs is not None:
        # The newest of the window (it is stamped ``now``, the window's end); recorded below in
        # the transaction of the first compare-and-set: one durable write per round, not two.
        window.append(obs)
    unrecorded = obs
    evaluation = None
    state, version = load_alert_state(consensus, shard_id)
    for attempt in range(MAX_CAS_ATTEMPTS):
        if attempt and state.last_evaluated_at is not None and state.last_evaluated_at >= now:
            # The evaluator that beat us evaluated this moment (or a later one) already.
            return EvaluationRound(evaluate(shard_id, window, settings, now, state, shard_exists=exists,
                                            unobservable=error), state, None, obs, error)
        evaluation = evaluate(shard_id, window, settings, now, state, shard_exists=exists, unobservable=error)
        new_state, action = advance_alert(state, evaluation, settings)
        new_state = replace(new_state, evaluated_by=observer)
        if not exists and version == 0:
            return EvaluationRound(evaluation, new_state, action, obs, error)
        page = dropped = None
        if action is not None:
            page = compose_page(evaluation, new_state, action)
            new_state, dropped = enqueue_page(new_state, page, uuid.uuid4().hex, now)
        blind_open = BlindState(**new_state.blind) if new_state.blind else blind
        if blind_open is not None and blind_open.paged:
            resolve = blind_page_event(blind_open, "resolve", now, namespace=namespace, shard_id=shard_id)
            new_state, more = enqueue_page(replace(new_state, blind=None), resolve, uuid.uuid4().hex, now)
            dropped = (dropped or ()) + more
        new_state, pages = take_pages(new_state, now)
        if between_load_and_save is not None:
            between_load_and_save(shard_id, state, version)

        def record_and_save(conn, to_record=unrecorded, new_state=new_state, version=version) -> bool:
            if to_record is not None:
                _record(conn, to_record)  # recorded whether or not the compare-and-set wins
            return _save(conn, new_state, version)

        saved = consensus.run_in_transaction(record_and_save)
        unrecorded = None
        if saved:
            for entry in dropped or ():
                log.warning("shard %s: outbox full (%d pages): dropped the undelivered %s %r (%d dropped so far)",
                            shard_id, MAX_OUTBOX, entry["event"].get("action"), entry["event"].get("summary"),
                            new_state.outbox_dropped)
            return EvaluationRound(evaluation, new_state, action, obs, error, pages, page)
        state, version = load_alert_state(consensus, shard_id)
    log.warning("shard %s: alert state lost %s compare-and-sets in a row; no page action from this round",
                shard_id, MAX_CAS_ATTEMPTS)
    assert evaluation is not None
    return EvaluationRound(evaluation, state, None, obs, error)


def record_blind(consensus: Consensus, shard_id: str, blind: BlindState) -> bool:
    """Keep in the shard's alert state that the monitor's own page for it was sent (``blind``),
    so that whichever round evaluates it next resolves it. False when another writer kept
    winning the compare-and-set."""
    from dataclasses import asdict

    for _ in range(MAX_CAS_ATTEMPTS):
        state, version = load_alert_state(consensus, shard_id)
        if save_alert_state(consensus, replace(state, blind=asdict(blind)), version):
            return True
    return False


def settle_outbox(consensus: Consensus, shard_id: str, *, delivered: Sequence[str] = (),
                  released: Sequence[str] = (), sent_at: float | None = None,
                  reached: Mapping[str, Sequence[str]] | None = None, unsent_reason: str | None = None) -> bool:
    """After a delivery: drop the ``delivered`` pages from the shard's outbox and make the
    ``released`` ones (not delivered) due again, remembering the channels each ``reached``
    (page id -> channels: never sent there again), by compare-and-set against concurrent rounds;
    ``sent_at`` (they reached a channel then) is kept as the shard's last page sent; without it
    ``unsent_reason`` says why they reached none.
    False when it lost MAX_CAS_ATTEMPTS races in a row (a delivered page is then sent again
    once its lease runs out: a page is delivered at least once)."""
    for _ in range(MAX_CAS_ATTEMPTS):
        state, version = load_alert_state(consensus, shard_id)
        settled = settle_pages(state, delivered, released, sent_at, reached=reached, unsent_reason=unsent_reason)
        if settled == state or save_alert_state(consensus, settled, version):
            return True
    return False


def peek_shard(
    consensus: Consensus,
    blob: "Blob",
    shard_id: str,
    settings: StallSettings,
    *,
    observer: str,
    now: float | None = None,
    observe_first: bool = True,
    open_shard: ShardOpener | None = None,
) -> EvaluationRound:
    """An evaluation that changes no alert state and owns no page action (``upsertctl frontier
    status``): a look by hand must neither count as a breaching evaluation nor take the page
    away from the sensor that would send it. It records its observation (if it observes); a
    shard that cannot be observed is judged as ``evaluate_shard`` judges it."""
    now = time.time() if now is None else float(now)
    exists = _shard_exists(consensus, shard_id)
    obs = error = None
    if exists and observe_first:
        obs, error = _try_observe(_opener(consensus, blob, open_shard), shard_id, observer=observer, now=now)
        if obs is not None:
            record_observation(consensus, obs)
    window = judging_window(consensus, shard_id, settings, now) if exists else []
    state, _ = load_alert_state(consensus, shard_id)
    evaluation = evaluate(shard_id, window, settings, now, state, shard_exists=exists, unobservable=error)
    return EvaluationRound(evaluation, state, None, obs, error)


def evaluate_shards(
    consensus: Consensus,
    blob: "Blob",
    shard_ids: Sequence[str] | None,
    settings: StallSettings,
    observer: str,
    *,
    now: float | None = None,
    open_shard: ShardOpener | None = None,
) -> list[EvaluationRound]:
    """A round for each of ``shard_ids`` (None: every shard in the store), in order; a shard
    that cannot be observed has its round too (``observe_error``) and stops no other."""
    ids = [r.shard_id for r in consensus.list_shards()] if shard_ids is None else list(shard_ids)
    return [evaluate_shard(consensus, blob, shard_id, settings, observer=observer, now=now, open_shard=open_shard)
            for shard_id in ids]


@dataclass(frozen=True)
class ObserveReport:
    """What ``observe_shards`` recorded, and the shards it could not observe with the reason."""

    observations: list[Observation]
    unobservable: dict[str, str]


def observe_shards(
    consensus: Consensus, blob: "Blob", shard_ids: Sequence[str] | None, *, observer: str,
    now: float | None = None, open_shard: ShardOpener | None = None,
) -> ObserveReport:
    """Observe and record each of ``shard_ids`` (None: every shard). Unknown shards raise
    ShardNotFound before anything is recorded; a shard that cannot be observed (its source
    cannot be read, a Kafka shard without its client config) is reported with the reason and
    the others are observed all the same."""
    ids = [r.shard_id for r in consensus.list_shards()] if shard_ids is None else list(shard_ids)
    for shard_id in ids:
        consensus.get_shard(shard_id)  # ShardNotFound, before anything is recorded
    opener = _opener(consensus, blob, open_shard)
    recorded: list[Observation] = []
    unobservable: dict[str, str] = {}
    for shard_id in ids:
        obs, error = _try_observe(opener, shard_id, observer=observer,
                                  now=time.time() if now is None else float(now))
        if obs is None:
            unobservable[shard_id] = error or "unknown error"
            continue
        record_observation(consensus, obs)
        recorded.append(obs)
    return ObserveReport(recorded, unobservable)
