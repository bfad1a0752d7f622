"""A shard page in the Airflow UI: every shard of the configured upsert connections, and for
one shard its committed offsets against the source's high watermark over time.

Served by the api-server as a plugin FastAPI app under ``URL_PREFIX`` and linked from the
navigation as an external view (shown in an iframe at ``/plugin/upsert-shards``). Every route
asks for Airflow's signed-in user (plugin apps are mounted without authentication), and a
connection's shards are shown only to a user whom Airflow's auth manager allows to read that
connection. Nothing that locates or opens a store is shown: a connection's consensus store is
named by its backend only (``postgresql``, ``sqlite``), and error messages have the store's
host, port, user, database, password and blob root masked.

What the page shows is read, never written, and needs no Spark: the shard record (upper,
since), the batch at ``upper - 1`` (when and by which writer it committed, its rows), the
stream's status, the checkpoint catalog, and the frontier observations that writers, sensors
and ``upsertctl frontier observe`` record. The stall status is an evaluation of the recorded
window at the time of the request, as ``peek_shard(observe_first=False)`` makes it: it records
no observation and changes no alert state, so looking at the page never takes a page away from
the sensor that would send it. It judges with the settings the shard's monitor (the frontier
sensor) evaluated with, which the monitor keeps in the shard's alert state, so that the page and
the monitor reach one verdict; a shard no monitor has evaluated is judged with the rules' defaults
and says so. Lag (in the source's unit: records for Kafka, segment files for a directory), how
long the oldest has been pending and the high watermark are the newest observation's; a shard
nobody observes shows STALE, which is the truth about its monitoring.

The list is paged (``DEFAULT_PAGE_SIZE`` shards, at most ``MAX_PAGE_SIZE``): listing a store is one
query, and only the page's shards are read in full. A signed-out visitor of the page is sent to
Airflow's login route; the script follows Airflow's light/dark color mode (``static/ui.js``).

The prefix is ``/upsert-provider-ui``, not a path under the documentation app's
``/upsert-provider``: Airflow mounts plugin apps in plugin order, and a mount at
``/upsert-provider`` would swallow ``/upsert-provider/ui/...`` whenever it came first.
"""

from __future__ import annotations

import json
import os
import threading
import time
from importlib.resources import files
from typing import Any, Callable

from airflow.plugins_manager import AirflowPlugin
from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from airflow_upsert_provider.plugins.connection_test import UpsertConnectionTestPort
from airflow_upsert_provider.links import (
    URL_PREFIX,
    VIEW_ROUTE,
    asset_path,
    dag_runs_path,
    parse_writer_id,
    task_instance_path,
)

PLUGIN_NAME = "upsert_provider_ui"
# The external view's iframe source: relative (no leading slash), so the UI's <base href>
# resolves it under the api-server's root path, sub-path deployments included.
VIEW_HREF = URL_PREFIX.lstrip("/") + "/"
UPSERT_CONN_TYPE = "upsert"
# Observations shown in the chart: at most this many seconds back (the store keeps 24 h).
DEFAULT_CHART_SECONDS = 6 * 3600.0
MAX_CHART_POINTS = 2000
# Shards per page of the list: a store may hold hundreds; each listed shard costs a few reads.
DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 200
# Seconds a connection's store has to list its shards; a store that takes longer (a host that
# accepts and never answers waits out the driver's connect timeout, ~20 s) is shown unreachable.
STORE_LIST_SECONDS = 5.0
STATIC_FILES = {"ui.js": "text/javascript; charset=utf-8", "ui.css": "text/css; charset=utf-8"}

# Only the page's own script and style files run; it may be framed only by Airflow's own UI.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
        "frame-ancestors 'self'; base-uri 'none'; form-action 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
}

PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="color-scheme" content="light dark">
<title>Upsert shards</title>
<link rel="stylesheet" href="static/ui.css">
<script src="static/ui.js" defer></script>
</head><body>
<header><h1>Upsert shards</h1><span id="refreshed" class="muted"></span></header>
<p id="errors" class="errors" hidden></p>
<nav class="pager"><input id="match" type="search" placeholder="Filter by shard id" aria-label="Filter by shard id">
<button id="prev" type="button" disabled>Previous</button><span id="range" class="muted"></span>
<button id="next" type="button" disabled>Next</button></nav>
<div class="table-wrap"><table id="shards"><thead><tr>
<th>Shard</th><th>Frontier</th><th>Lag</th><th>Pending for</th><th>Stream</th><th>Upper</th><th>Since</th>
<th>Last batch rows (in / out)</th><th>Last commit</th><th>Last checkpoint</th>
</tr></thead><tbody><tr><td colspan="10" class="muted">Loading&hellip;</td></tr></tbody></table></div>
<section id="detail" hidden>
<h2 id="chart-title"></h2>
<div class="chart-bar"><p class="legend" id="legend"></p>
<span id="ranges" class="ranges" role="group" aria-label="Chart range"><button type="button" data-seconds="3600">1h</button><button
 type="button" data-seconds="21600">6h</button><button type="button" data-seconds="86400">24h</button></span></div>
<div id="chart"></div>
<ul id="reasons"></ul>
<h3>Lag per partition <span id="partitions-at" class="muted"></span></h3>
<p id="partitions-note" class="muted" hidden></p>
<table id="partitions"><thead><tr><th>Partition</th><th>Source high watermark (offset)</th><th>Committed (offset)</th>
<th id="partitions-lag">Lag</th></tr></thead><tbody></tbody></table>
<h3>Table schema <span id="schema-version" class="muted"></span></h3>
<table id="schema-history"><thead><tr><th>Version</th><th>When</th><th>By</th><th>What changed</th></tr></thead>
<tbody></tbody></table>
<h3>Verdict</h3>
<p id="judged-with" class="muted"></p>
<dl id="monitor" class="facts"></dl>
<dl id="thresholds" class="facts"></dl>
</section>
</body></html>
"""


# -- reading the stores (plain functions: the routes and the tests call them) -------------------


def upsert_conn_ids() -> list[str]:
    """The upsert connections Airflow knows: ``upsert_default`` (its embedded defaults apply when
    it is not defined), those in the metadata database and those in AIRFLOW_CONN_* variables."""
    from airflow_upsert_provider.hooks.upsert import DEFAULT_CONN_ID

    found = {DEFAULT_CONN_ID}
    for name, value in os.environ.items():
        if name.startswith("AIRFLOW_CONN_") and _env_conn_type(value) == UPSERT_CONN_TYPE:
            found.add(name[len("AIRFLOW_CONN_"):].lower())
    try:
        from sqlalchemy import select

        from airflow.models.connection import Connection
        from airflow.utils.session import create_session

        with create_session() as session:
            found.update(session.scalars(select(Connection.conn_id).where(Connection.conn_type == UPSERT_CONN_TYPE)))
    except Exception:  # a metadata DB that cannot be read leaves the others listed
        pass
    return sorted(found)


def _env_conn_type(value: str) -> str | None:
    value = value.strip()
    if value.startswith("{"):
        try:
            return str(json.loads(value).get("conn_type") or "").replace("-", "_") or None
        except (ValueError, AttributeError):
            return None
    return value.split("://", 1)[0].replace("-", "_") if "://" in value else None


def _safe_message(exc: BaseException, secrets: list[str]) -> str:
    text = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    for secret in sorted((s for s in secrets if s), key=len, reverse=True):
        text = text.replace(secret, "***")
    return f"{type(exc).__name__}: {text}"


def _sqlite_file_missing(url: str) -> bool:
    from sqlalchemy.engine.url import make_url

    try:
        parsed = make_url(url)
    except Exception:
        return False
    return parsed.get_backend_name() == "sqlite" and bool(parsed.database) and not os.path.exists(parsed.database)


class _Store:
    """One connection's consensus and blob, opened read-only (no table is created)."""

    def __init__(self, conn_id: str) -> None:
        from airflow_upsert_provider.hooks.upsert import UpsertShardHook

        self.conn_id = conn_id
        self.hook = UpsertShardHook(upsert_conn_id=conn_id)
        self.consensus = None
        self.blob = None
        settings = self.hook.settings
        self.backend = consensus_backend(settings.consensus_url)
        self._secrets = [*_url_parts(settings.consensus_url), str(settings.blob_root or "")]
        self.missing = _sqlite_file_missing(settings.consensus_url)

    def open(self) -> "_Store":
        """Open the store (unless it is missing). Separate from the constructor: opening
        reaches the store (its schema version), and what that raises must pass through
        :meth:`scrub`, which needs the constructed object."""
        if not self.missing:
            from airflow_upsert_provider.engine.blob.files import open_blob
            from airflow_upsert_provider.engine.store.registry import open_consensus

            settings = self.hook.settings
            self.consensus = open_consensus(settings.consensus_url, create=False)
            self.blob = open_blob(settings.blob_root)
        return self

    def scrub(self, exc: BaseException) -> str:
        return _safe_message(exc, self._secrets)

    def close(self) -> None:
        if self.consensus is not None:
            self.consensus.dispose()


def consensus_backend(url: str) -> str | None:
    """The kind of a consensus store (``postgresql``, ``sqlite``): all the page says of it."""
    from sqlalchemy.engine.url import make_url

    try:
        return make_url(url).get_backend_name()
    except Exception:
        return None


def _url_parts(url: str) -> list[str]:
    """What in a consensus URL locates or opens the store, longest first (masked in messages):
    the URL, password, user, host, database and port."""
    from sqlalchemy.engine.url import make_url

    try:
        parsed = make_url(url)
    except Exception:
        return [url]
    parts = [url, parsed.password, parsed.username, parsed.host, parsed.database,
             str(parsed.port) if parsed.port else None]
    return sorted({str(p) for p in parts if p}, key=len, reverse=True)


def shard_summary(store: _Store, record: Any, now: float) -> dict[str, Any]:
    """What the page lists for one shard; every part that cannot be read says why instead."""
    from airflow_upsert_provider.engine.maintenance.checkpoint_catalog import Catalog
    from airflow_upsert_provider.engine.frontier.alerts import judging_settings
    from airflow_upsert_provider.engine.frontier.rules import evaluate
    from airflow_upsert_provider.engine.frontier.observations import load_alert_state, observation_window
    from airflow_upsert_provider.engine.common.time_text import format_duration_to_the_second
    from airflow_upsert_provider.engine.sources.lag import format_lag
    from airflow_upsert_provider.engine.store.streams import read_stream

    consensus, shard_id = store.consensus, record.shard_id
    row: dict[str, Any] = {
        "conn_id": store.conn_id, "shard": shard_id, "upper": record.upper, "since": record.since,
        "source": _source_kind(record.config), "errors": [],
    }
    last = consensus.get_batch(shard_id, record.upper - 1) if record.upper > 0 else None
    row["last_commit_at"] = None if last is None else float(last.committed_at)
    row["last_writer"] = None if last is None else last.writer_id
    writer = parse_writer_id(row["last_writer"])
    # Paths in Airflow's UI (relative to its root): the writer's task try, its DAG's runs.
    row["links"] = {"writer": task_instance_path(row["last_writer"]),
                    "dag_runs": None if writer is None else dag_runs_path(writer["dag_id"]), "asset": None}
    row["last_batch"] = None if last is None else {
        "ts": last.ts, "rows_in": last.stats.get("rows_in"), "rows_out": last.stats.get("rows_out"),
        # Fields its records carried that the schema does not name (ignored): {name: {records, file}}.
        "unknown_fields": last.stats.get("unknown_fields") or {},
    }
    try:
        stream = read_stream(consensus, shard_id)
        row["stream"] = {"status": stream.status.value, "epoch": stream.epoch, "changed_by": stream.changed_by,
                         "changed_at": stream.changed_at or None, "reason": stream.reason}
    except Exception as exc:
        row["stream"] = None
        row["errors"].append(f"stream: {store.scrub(exc)}")
    # One verdict: the settings the shard's monitor evaluated with (kept in its alert state).
    state, version = load_alert_state(consensus, shard_id)
    settings, settings_note = judging_settings(state)
    window = observation_window(consensus, shard_id, now - settings.window_seconds, now)
    newest = window[-1] if window else _newest_observation(consensus, shard_id, now)
    row["observed_at"] = None if newest is None else newest.observed_at
    row["lag"] = None if newest is None else newest.lag
    row["lag_unit"] = None if newest is None else newest.lag_unit
    row["lag_seconds"] = None if newest is None else newest.lag_seconds
    # As logs and pages say them: "12 segments", "2m40s" (one formatting, the engine's).
    row["lag_text"] = None if newest is None else format_lag(newest.lag, newest.lag_unit)
    row["pending_for"] = None if row["lag_seconds"] is None else format_duration_to_the_second(row["lag_seconds"])
    row["high_watermark"] = None if newest is None else sum(newest.high_watermark.values())
    # The evaluation peek_shard(observe_first=False) makes: nothing recorded, no state saved.
    evaluation = evaluate(shard_id, window, settings, now, state, shard_exists=True)
    row["frontier"] = {"status": evaluation.status.value, "reasons": list(evaluation.reasons), "rule": evaluation.rule,
                       "judged_with": "defaults" if settings_note else "monitor", "note": settings_note,
                       "thresholds": settings.thresholds(), "thresholds_text": _durations(settings.thresholds())}
    row["monitor"] = None if version == 0 else monitor_summary(state)
    try:
        row["schema"] = schema_summary(consensus, record)
    except Exception as exc:
        row["schema"] = None
        row["errors"].append(f"schema: {store.scrub(exc)}")
    try:
        latest = Catalog.load(store.blob, shard_id, store.consensus).latest()
        row["last_checkpoint"] = None if latest is None else {
            "id": latest.id, "upper": latest.upper, "created_at": latest.created_at}
    except Exception as exc:
        row["last_checkpoint"] = None
        row["errors"].append(f"checkpoints: {store.scrub(exc)}")
    return row


def schema_summary(consensus: Any, record: Any) -> dict[str, Any]:
    """The shard's table schema version now and every version, oldest first: its number, when
    and by whom it was made (version 1: the shard's creation), and what changed."""
    from airflow_upsert_provider.engine.config import ShardConfig
    from airflow_upsert_provider.engine.store.table_schemas import schema_history

    history = schema_history(consensus, record.shard_id, ShardConfig.from_json(record.config).schema)
    return {"version": history[-1].version, "history": [
        {"version": v.version, "created_at": record.created_at if v.created_at is None else v.created_at,
         "created_by": v.created_by, "change": v.change, "change_text": describe_schema_change(v.change)}
        for v in history]}


def describe_schema_change(change: dict[str, Any]) -> str:
    """What a schema version changed, as the page says it: "created", "added discount
    double", "widened qty to bigint"; a change of another kind as recorded. Pure."""
    parts = []
    for kind, value in change.items():
        if kind == "init":
            parts.append("created")
        elif kind in ("add", "widen") and isinstance(value, list) and all(isinstance(c, dict) for c in value):
            columns = ", ".join(f"{c.get('name')} {'to ' if kind == 'widen' else ''}{c.get('type')}" for c in value)
            parts.append(f"{'added' if kind == 'add' else 'widened'} {columns}")
        else:
            parts.append(f"{kind}: {json.dumps(value, sort_keys=True)}")
    return "; ".join(parts) or "—"


def _durations(thresholds: dict[str, Any]) -> dict[str, str]:
    """The thresholds in seconds as logs and pages say them ("2m00s")."""
    from airflow_upsert_provider.engine.common.time_text import format_duration_to_the_second

    return {name: format_duration_to_the_second(value) for name, value in thresholds.items()
            if name.endswith("_seconds") and isinstance(value, (int, float)) and not isinstance(value, bool)}


def monitor_summary(state: Any) -> dict[str, Any]:
    """What the shard's monitor last decided (its alert state): its last evaluation, by whom,
    and the page it has open, if any (since when, how many reached a channel, when last, why
    none did, how many a full outbox dropped)."""
    return {
        "evaluated_by": state.evaluated_by, "last_evaluated_at": state.last_evaluated_at,
        "last_status": state.last_status, "firing": state.firing, "firing_status": state.firing_status,
        "incident_started_at": state.incident_started_at, "consecutive_breaches": state.consecutive_breaches,
        "pages_sent": state.pages_sent, "last_sent_at": state.last_sent_at, "pages_pending": len(state.outbox),
        "pages_dropped": state.outbox_dropped, "unsent_reason": state.unsent_reason,
    }


def _newest_observation(consensus, shard_id: str, now: float):
    from airflow_upsert_provider.engine.frontier.observations import OBSERVATION_RETENTION_SECONDS, observation_window

    older = observation_window(consensus, shard_id, now - OBSERVATION_RETENTION_SECONDS, now)
    return older[-1] if older else None


def _source_kind(config_json: str) -> str | None:
    try:
        source = json.loads(config_json).get("source")
    except (ValueError, AttributeError):
        return None
    if isinstance(source, dict):
        return str(source.get("kind") or source.get("type") or "") or None
    return str(source).split(":", 1)[0] if source else None


ConnectionFilter = Callable[[set[str]], set[str]]


class _Listing(threading.Thread):
    """One connection's store opened and its shards listed, in a thread of its own. The page
    takes the result (:meth:`take`) until a deadline; a listing not done by then is abandoned,
    and closes its store itself when it ends."""

    def __init__(self, conn_id: str) -> None:
        super().__init__(name=f"upsert-ui-list-{conn_id}", daemon=True)
        self.conn_id = conn_id
        self.store: _Store | None = None
        self.backend: str | None = None
        self.records: list[Any] = []
        self.error: str | None = None
        self._lock = threading.Lock()
        self._done = False
        self._abandoned = False

    def run(self) -> None:
        try:
            self.store = _Store(self.conn_id)
            self.backend = self.store.backend
            self.store.open()
            if self.store.missing:
                self.error = "no consensus store yet (nothing was created with this connection)"
            else:
                self.records = sorted(self.store.consensus.list_shards(), key=lambda r: r.shard_id)
        except Exception as exc:
            self.error = self.store.scrub(exc) if self.store is not None else _safe_message(exc, [])
        finally:
            with self._lock:
                self._done = True
                abandoned = self._abandoned
            if abandoned and self.store is not None:
                self.store.close()

    def take(self, deadline: float) -> bool:
        """Whether the listing ended by ``deadline`` (a ``time.monotonic()`` value); if not,
        it is abandoned: the caller must not use or close its store."""
        self.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            if not self._done:
                self._abandoned = True
            return self._done


def list_shards(now: float | None = None, readable: ConnectionFilter = lambda ids: ids, *, offset: int = 0,
                limit: int = DEFAULT_PAGE_SIZE, match: str = "", focus: tuple[str, str] | None = None,
                store_seconds: float | None = None) -> dict[str, Any]:
    """One page of the shards of every upsert connection in ``readable(connection ids)`` (those
    the user may read), ordered by connection and shard id, and per connection how many shards
    it has and what could not be read. Listing a store is one query; only the page's shards are
    read in full, so a store of many shards answers as fast as one of a page.

    ``match``: only shard ids containing it (case-insensitive). ``focus`` (connection, shard):
    the page that holds that shard, whatever ``offset`` says (a deep link). ``store_seconds``:
    how long a store may take to list its shards (default ``STORE_LIST_SECONDS``); a store that
    takes longer is marked unreachable and the page is answered without it."""
    store_seconds = STORE_LIST_SECONDS if store_seconds is None else store_seconds
    now = time.time() if now is None else now
    limit = max(1, min(int(limit), MAX_PAGE_SIZE))
    connections: list[dict[str, Any]] = []
    stores: dict[str, _Store] = {}
    listed: list[tuple[str, Any]] = []
    needle = match.strip().lower()
    known = upsert_conn_ids()
    allowed = readable(set(known))
    # Each store is listed in its own thread: one that does not answer within the limit holds
    # neither the others nor the page (its thread ends, and closes its store, on its own).
    listings = [_Listing(conn_id) for conn_id in known if conn_id in allowed]
    for listing in listings:
        listing.start()
    deadline = time.monotonic() + store_seconds
    try:
        for listing in listings:
            entry: dict[str, Any] = {"conn_id": listing.conn_id, "consensus": None, "shards": 0, "error": None,
                                     "unreachable": False}
            connections.append(entry)
            if not listing.take(deadline):
                entry["consensus"] = listing.backend
                entry["unreachable"] = True
                entry["error"] = (f"unreachable: its consensus store did not answer within {store_seconds:g} s; "
                                  "its shards are not shown")
                continue
            entry["consensus"] = listing.backend
            if listing.store is not None:
                stores[listing.conn_id] = listing.store
            if listing.error is not None:
                entry["error"] = listing.error
                continue
            entry["shards"] = len(listing.records)
            listed.extend((listing.conn_id, r) for r in listing.records if needle in r.shard_id.lower())
        if focus is not None:
            at = next((i for i, (c, r) in enumerate(listed) if (c, r.shard_id) == tuple(focus)), None)
            if at is not None:
                offset = at - at % limit
        offset = max(0, min(int(offset), max(0, len(listed) - 1)))
        shards: list[dict[str, Any]] = []
        for conn_id, record in listed[offset:offset + limit]:
            store = stores[conn_id]
            try:
                shards.append(shard_summary(store, record, now))
            except Exception as exc:
                shards.append({"conn_id": conn_id, "shard": record.shard_id, "upper": record.upper,
                               "since": record.since, "errors": [store.scrub(exc)]})
    finally:
        for store in stores.values():
            store.close()
    _link_assets(shards)
    # How many upsert connections the user's role may not read (not which): the page says why
    # it shows no shard of them, instead of "no shard".
    return {"generated_at": now, "connections": connections, "shards": shards, "total": len(listed),
            "offset": offset, "limit": limit, "match": match,
            "unreadable": sum(1 for conn_id in known if conn_id not in allowed)}


def asset_ids(uris: set[str]) -> dict[str, int]:
    """The metadata database's Asset ids of those ``uris`` it knows (none when it cannot be read)."""
    if not uris:
        return {}
    try:
        from sqlalchemy import select

        from airflow.models.asset import AssetModel
        from airflow.utils.session import create_session

        with create_session() as session:
            return {uri: int(asset_id) for asset_id, uri in
                    session.execute(select(AssetModel.id, AssetModel.uri).where(AssetModel.uri.in_(sorted(uris))))}
    except Exception:  # a metadata DB that cannot be read leaves the shards without an Asset link
        return {}


def _link_assets(shards: list[dict[str, Any]]) -> None:
    """Each listed shard's link to its Asset (``upsert://<connection>/<shard>``), when Airflow knows it."""
    from airflow_upsert_provider.operators.upsert import shard_asset

    uri_of = {id(row): shard_asset(row["conn_id"], row["shard"]).uri for row in shards if "links" in row}
    found = asset_ids(set(uri_of.values()))
    for row in shards:
        asset_id = found.get(uri_of.get(id(row), ""))
        if asset_id is not None:
            row["links"]["asset"] = asset_path(asset_id)


def shard_observations(conn_id: str, shard_id: str, seconds: float = DEFAULT_CHART_SECONDS,
                       now: float | None = None, readable: ConnectionFilter = lambda ids: ids) -> dict[str, Any] | None:
    """The chart's points: per observation its time, upper, source high watermark and offsets
    bound at the upper (summed over partitions), lag and its unit. None: no such shard, or a
    connection the user may not read (the same answer: its existence is not disclosed)."""
    from airflow_upsert_provider.engine.frontier.observations import observation_window
    from airflow_upsert_provider.engine.sources.lag import RECORDS, format_lag

    now = time.time() if now is None else now
    if conn_id not in upsert_conn_ids() or conn_id not in readable({conn_id}):
        return None
    store = _Store(conn_id)
    try:
        store.open()
        if store.missing or not any(r.shard_id == shard_id for r in store.consensus.list_shards()):
            return None
        window = observation_window(store.consensus, shard_id, now - seconds, now)[-MAX_CHART_POINTS:]
        points = [{"t": o.observed_at, "upper": o.upper, "high_watermark": sum(o.high_watermark.values()),
                   "bound": sum(o.bound.values()), "lag": o.lag, "lag_unit": o.lag_unit,
                   "observer": o.observer}
                  for o in window]
        newest = window[-1] if window else None
        # Per partition, the lag in the shard's unit as the observation recorded it (the
        # partitions with the most; the others counted), else where offsets count it (a Kafka
        # offset is a record). A directory's offsets are segment file numbers, whose distance is
        # no lag: an observation recorded before the lag per partition was kept has none.
        recorded = None if newest is None else newest.partition_lag
        kept = {} if recorded is None else {e["partition"]: e["lag"] for e in recorded["top"]}

        def lag_of(partition: str, high_watermark: int) -> int | None:
            if recorded is not None:
                return kept.get(partition)
            return max(0, high_watermark - newest.bound.get(partition, 0)) if newest.lag_unit == RECORDS else None

        partitions = [] if newest is None else [
            {"partition": p, "high_watermark": hw, "bound": newest.bound.get(p, 0), "lag": lag_of(p, hw)}
            for p, hw in sorted(newest.high_watermark.items())]
        return {"conn_id": conn_id, "shard": shard_id, "from": now - seconds, "to": now, "points": points,
                "partitions": partitions, "partitions_at": None if newest is None else newest.observed_at,
                "partition_lag": recorded,
                "lag_unit": None if newest is None else newest.lag_unit,
                "lag": None if newest is None else newest.lag,
                "lag_text": None if newest is None else format_lag(newest.lag, newest.lag_unit)}
    finally:
        store.close()


# -- the app ------------------------------------------------------------------------------------


def readable_connections(user: Any) -> ConnectionFilter:
    """The connection ids among those given that Airflow's auth manager lets ``user`` read
    (``GET`` on the connection, as Airflow's own connection pages ask)."""
    def readable(conn_ids: set[str]) -> set[str]:
        from airflow.api_fastapi.app import get_auth_manager

        return set(get_auth_manager().filter_authorized_connections(conn_ids=set(conn_ids), user=user,
                                                                    method="GET"))

    return readable


def _is_page(request: Request) -> bool:
    root = request.scope.get("root_path", "").rstrip("/")
    return request.url.path.rstrip("/") == root


def login_path(request: Request) -> str:
    """Airflow's login route (whichever auth manager is configured), from the server's root,
    with the page's own URL to come back to."""
    from urllib.parse import urlencode

    root = request.scope.get("root_path", "").rstrip("/").removesuffix(URL_PREFIX)
    return f"{root}/api/v2/auth/login?{urlencode({'next': str(request.url)})}"


def create_ui_app() -> FastAPI:
    from airflow.api_fastapi.core_api.security import get_user

    app = FastAPI(title="Upsert shards", docs_url=None, redoc_url=None, openapi_url=None,
                  dependencies=[Depends(get_user)])

    @app.exception_handler(HTTPException)
    async def signed_out(request: Request, exc: HTTPException) -> Response:
        # A signed-out visitor of the page itself goes to Airflow's login page, and comes back
        # after it; the script, style and JSON answer 401 as before.
        if exc.status_code == 401 and request.method == "GET" and _is_page(request):
            return RedirectResponse(login_path(request), status_code=307)
        return await http_exception_handler(request, exc)

    def connection_filter(user: Any = Depends(get_user)) -> ConnectionFilter:
        return readable_connections(user)

    @app.get("/", response_class=HTMLResponse)
    def page() -> HTMLResponse:
        return HTMLResponse(PAGE, headers=SECURITY_HEADERS)

    @app.get("/static/{name}")
    def static(name: str) -> Response:
        media_type = STATIC_FILES.get(name)
        if media_type is None:
            raise HTTPException(status_code=404, detail="no such file")
        body = (files("airflow_upsert_provider.plugins") / "static" / name).read_bytes()
        return Response(body, media_type=media_type, headers=SECURITY_HEADERS)

    @app.get("/api/shards")
    def shards(offset: int = Query(0, ge=0), limit: int = Query(DEFAULT_PAGE_SIZE, ge=1, le=MAX_PAGE_SIZE),
               match: str = Query("", max_length=250), conn: str | None = Query(None, max_length=250),
               shard: str | None = Query(None, max_length=250),
               readable: ConnectionFilter = Depends(connection_filter)) -> JSONResponse:
        focus = (conn or "upsert_default", shard) if shard else None
        return JSONResponse(list_shards(readable=readable, offset=offset, limit=limit, match=match, focus=focus),
                            headers=SECURITY_HEADERS)

    @app.get("/api/shards/{shard_id}/observations")
    def observations(shard_id: str, conn: str = Query("upsert_default", max_length=250),
                     seconds: float = Query(DEFAULT_CHART_SECONDS, gt=0, le=24 * 3600),
                     readable: ConnectionFilter = Depends(connection_filter)) -> JSONResponse:
        found = shard_observations(conn, shard_id, seconds, readable=readable)
        if found is None:
            raise HTTPException(status_code=404, detail=f"no shard {shard_id!r} in connection {conn!r}")
        return JSONResponse(found, headers=SECURITY_HEADERS)

    return app


app = create_ui_app()


class UpsertProviderUiPlugin(AirflowPlugin):
    """Mounts the shard page under ``URL_PREFIX`` and links it from the navigation (Browse);
    makes the connection list's Test button work for upsert connections (connection_test.py)."""

    name = PLUGIN_NAME
    fastapi_apps = [{"app": app, "url_prefix": URL_PREFIX, "name": "airflow-upsert-provider shards"}]
    fastapi_root_middlewares = [{"middleware": UpsertConnectionTestPort, "args": [], "kwargs": {},
                                 "name": "airflow-upsert-provider connection test port"}]
    external_views = [{
        "name": "Upsert shards",
        "href": VIEW_HREF,
        "url_route": VIEW_ROUTE,
        "destination": "nav",
        "category": "browse",
    }]
