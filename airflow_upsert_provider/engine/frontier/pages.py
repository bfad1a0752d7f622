"""What a shard's page says: its summary, severity, dedup key and details, in the fields of an
Events API v2 event (``page_event``). Pure; the outbox (``engine/frontier/alerts.py``) keeps the
events, the senders (notifications/frontier.py) deliver them.
"""

from __future__ import annotations

import hashlib
from typing import Any, Sequence

from airflow_upsert_provider.engine.common.time_text import format_duration, format_duration_to_the_second
from airflow_upsert_provider.engine.common.time_text import format_timestamp
from airflow_upsert_provider.engine.errors import ConfigurationError
from airflow_upsert_provider.engine.frontier.alerts import AlertState
from airflow_upsert_provider.engine.frontier.model import (
    CRITICAL,
    WARNING,
    Evaluation,
    FrontierStatus,
    StallSettings,
)
from airflow_upsert_provider.engine.sources.lag import OFFSETS, format_lag

# The Events API limits a summary to 1024 characters and a dedup key to 255.
MAX_SUMMARY_CHARS = 1023
MAX_DEDUP_KEY_CHARS = 255

PAGE_SOURCE = "airflow-upsert-provider"
DEDUP_PREFIX = "airflow-upsert"


def dedup_key(shard_id: str, namespace: str = "") -> str:
    """The page key of a shard: stable across statuses and time, so one incident is one page."""
    key = f"{DEDUP_PREFIX}/{namespace}/{shard_id}"
    if len(key) > MAX_DEDUP_KEY_CHARS:
        digest = hashlib.sha256(key.encode()).hexdigest()[:16]
        key = key[:MAX_DEDUP_KEY_CHARS - 17] + "#" + digest
    return key


_SEVERITY_OF = {
    FrontierStatus.STALLED.value: CRITICAL,
    FrontierStatus.REWOUND.value: CRITICAL,
    FrontierStatus.STALE.value: CRITICAL,
    FrontierStatus.LAGGING.value: WARNING,
    FrontierStatus.STOPPED.value: WARNING,
    FrontierStatus.RECOVERING.value: WARNING,
}


def _summary(evaluation: Evaluation, action: str) -> str:
    e = evaluation
    shard = e.shard_id
    if action == "resolve":
        if e.status in (FrontierStatus.OK, FrontierStatus.LAGGING, FrontierStatus.IDLE):
            return f"RESOLVED: {shard} frontier moving again (upper {e.upper})"
        if e.status is FrontierStatus.NOT_FOUND:
            return f"RESOLVED: {shard} no longer exists"
        return f"RESOLVED: {shard} no longer breaching, now {e.status.value} (upper {e.upper})"
    behind = f"+{format_lag(e.lag, e.lag_unit or OFFSETS)}" if e.lag is not None else "lag unknown"
    if e.lag_seconds is not None:
        behind += f" / {format_duration_to_the_second(e.lag_seconds)}"
    if e.status is FrontierStatus.STALLED:
        return f"STALLED: {shard} stuck {format_duration(e.stuck_seconds)}, {behind} behind"
    if e.status is FrontierStatus.LAGGING:
        return f"LAGGING: {shard} {behind} behind and growing (upper {e.upper})"
    if e.status is FrontierStatus.REWOUND:
        return f"REWOUND: {shard} upper {e.upper}, maximum seen {e.max_upper}: {e.reasons[0] if e.reasons else ''}"
    if e.status is FrontierStatus.STALE:
        return f"STALE: {shard} not observed: {e.reasons[0] if e.reasons else e.rule}"
    if e.status in (FrontierStatus.STOPPED, FrontierStatus.RECOVERING):
        return f"{e.status.value}: {shard} {e.status.value.lower()} for {format_duration(e.stuck_seconds)} (upper {e.upper})"
    return f"{e.status.value}: {shard} (upper {e.upper})"


def page_event(evaluation: Evaluation, state: AlertState, action: str, settings: StallSettings, *,
               namespace: str = "", links: Sequence[dict] = (), run_ids: Sequence[str] = ()) -> dict[str, Any]:
    """What a page says, in the fields of an Events API v2 event. ``state`` is the alert state
    after ``advance_alert``."""
    if action not in ("trigger", "resolve"):
        raise ConfigurationError(f"page action must be 'trigger' or 'resolve' (got {action!r})", field="action")
    summary = _summary(evaluation, action)
    if len(summary) > MAX_SUMMARY_CHARS:
        summary = summary[:MAX_SUMMARY_CHARS - 1] + "…"
    if action == "trigger":
        severity = evaluation.severity or _SEVERITY_OF.get(evaluation.status.value, WARNING)
    else:
        # A resolve closes what the trigger opened; the severity of what was firing, if known.
        severity = _SEVERITY_OF.get(state.firing_status or "", "info")
    return {
        "action": action,
        "dedup_key": dedup_key(evaluation.shard_id, namespace),
        "summary": summary,
        "severity": severity,
        "source": PAGE_SOURCE,
        "component": evaluation.shard_id,
        "group": namespace or None,
        "timestamp": format_timestamp(evaluation.evaluated_at, missing=None),
        "custom_details": {
            "shard": evaluation.shard_id,
            "status": evaluation.status.value,
            "rule": evaluation.rule,
            "reasons": list(evaluation.reasons),
            "upper": evaluation.upper,
            "last_advance": format_timestamp(evaluation.last_advance_at, missing=None),
            "stuck_seconds": evaluation.stuck_seconds,
            "lag": evaluation.lag,
            "lag_unit": evaluation.lag_unit,
            "lag_seconds": evaluation.lag_seconds,
            "window": dict(evaluation.window),
            "thresholds": dict(evaluation.thresholds),
            "consecutive_breaches": state.consecutive_breaches,
            "writers_running": evaluation.writers_running,
            "run_ids": list(run_ids),
            "incident_started_at": format_timestamp(state.incident_started_at, missing=None),
        },
        "links": list(links),
    }
