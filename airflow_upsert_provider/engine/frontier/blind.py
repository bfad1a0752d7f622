"""A monitor that cannot evaluate pages for itself: ``BlindState`` says how long its
evaluations have failed and whether it paged, ``advance_blind`` decides the page action,
``blind_page_event`` what the page says, under the monitor's own dedup key. Pure; the
evaluators (sensor, trigger, the monitor DAG) keep the state and send the pages.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from airflow_upsert_provider.engine.common.time_text import format_duration
from airflow_upsert_provider.engine.common.time_text import format_timestamp
from airflow_upsert_provider.engine.errors import ConfigurationError
from airflow_upsert_provider.engine.frontier.model import CRITICAL
from airflow_upsert_provider.engine.frontier.pages import MAX_SUMMARY_CHARS, PAGE_SOURCE, dedup_key


# The dedup key's last part for the monitor itself: '#' is in no shard id, so the monitor's
# incident never merges with a shard's.
MONITOR_KEY = "#monitor"


def blind_dedup_key(namespace: str = "", shard_id: str | None = None) -> str:
    """The key of a monitor's own page: one per namespace and shard (a sensor watches one shard,
    and one recovering sensor must not resolve another's page); without a shard, the monitor's
    page for all of its shards (the store cannot even be listed)."""
    return dedup_key(f"{shard_id}{MONITOR_KEY}" if shard_id else MONITOR_KEY, namespace)


# Airflow limits a Variable's key to 250 characters, and a task reaches Variables by URL path,
# where '#', '?' and '%' would cut or change the key and '/' be read as a path.
MAX_RECORD_KEY_CHARS = 250
_RECORD_KEY_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")  # within a part: ':' separates them
RECORD_KEY_PREFIX = "airflow-upsert-monitor-blind"


def blind_record_key(namespace: str = "", shard_id: str | None = None) -> str:
    """The name under which a sent monitor page is recorded outside the consensus store (an
    Airflow Variable): ``airflow-upsert-monitor-blind:<namespace>:<shard>``, the parts of its
    dedup key. When a character a URL path would not carry had to be replaced, or the name is
    too long, it ends in a digest of the real name, so that two names never meet."""
    key = f"{RECORD_KEY_PREFIX}:{namespace}:{shard_id or ''}"
    safe = ":".join(_RECORD_KEY_UNSAFE.sub("_", part) for part in (RECORD_KEY_PREFIX, namespace, shard_id or ""))
    if safe != key or len(safe) > MAX_RECORD_KEY_CHARS:
        safe = safe[:MAX_RECORD_KEY_CHARS - 17] + "-" + hashlib.sha256(key.encode()).hexdigest()[:16]
    return safe


@dataclass(frozen=True)
class BlindState:
    """How long a monitor has been unable to evaluate, and whether it paged for it. Kept by
    the evaluator in its process (the store may be what is down), and, once its page was sent,
    in the shard's alert state (``AlertState.blind``) when the store takes it: a later run that
    evaluates again resolves it."""

    since: float | None = None   # the first failed evaluation of the current run of failures
    paged: bool = False
    error: str | None = None      # the latest failure


def advance_blind(state: BlindState, now: float, error: str | None,
                  limit_seconds: float) -> tuple[BlindState, str | None]:
    """The state after one evaluation attempt (``error``: why it failed; None: it worked) and
    the page action it calls for: "trigger" once failures have lasted ``limit_seconds``,
    "resolve" at the first evaluation that works after such a page."""
    if error is None:
        return BlindState(), ("resolve" if state.paged else None)
    since = state.since if state.since is not None else now
    if not state.paged and now - since >= limit_seconds:
        return BlindState(since, True, error), "trigger"
    return BlindState(since, state.paged, error), None


def blind_page_event(state: BlindState, action: str, now: float, *, namespace: str = "",
                     shard_id: str | None = None, limit_seconds: float | None = None) -> dict[str, Any]:
    """The page of a monitor that cannot evaluate (``action`` "trigger") or can again
    ("resolve"), under the monitor's own dedup key."""
    if action not in ("trigger", "resolve"):
        raise ConfigurationError(f"page action must be 'trigger' or 'resolve' (got {action!r})", field="action")
    seconds = None if state.since is None else now - state.since
    what = f"shard {shard_id}" if shard_id else "its shards"
    if action == "trigger":
        summary = (f"MONITOR BLIND: cannot evaluate {what} for {format_duration(seconds)}: "
                   f"{state.error or 'unknown error'}")
    else:
        summary = f"RESOLVED: the frontier monitor evaluates {what} again"
    if len(summary) > MAX_SUMMARY_CHARS:
        summary = summary[:MAX_SUMMARY_CHARS - 1] + "…"
    return {
        "action": action,
        "dedup_key": blind_dedup_key(namespace, shard_id),
        "summary": summary,
        "severity": CRITICAL if action == "trigger" else "info",
        "source": PAGE_SOURCE,
        "component": MONITOR_KEY,
        "group": namespace or None,
        "timestamp": format_timestamp(now, missing=None),
        "custom_details": {
            "shard": shard_id,
            "status": "MONITOR_BLIND" if action == "trigger" else "MONITOR_OK",
            "error": state.error,
            "failing_since": format_timestamp(state.since, missing=None),
            "failing_seconds": seconds,
            "limit_seconds": limit_seconds,
            "reasons": [f"every evaluation since {format_timestamp(state.since, missing=None)} failed: {state.error}: no stall of "
                        f"{what} can be seen, so none can page"] if action == "trigger" else [],
        },
        "links": [],
    }


def blind_record(state: BlindState) -> str:
    """What is recorded of a sent monitor page (``parse_blind_record`` reads it back)."""
    return json.dumps(asdict(state), sort_keys=True)


def parse_blind_record(text: Any, where: str) -> tuple[BlindState, str | None]:
    """The monitor page recorded in ``text`` and None; or, when ``text`` is not such a record
    (edited by hand, cut short), a page taken as sent all the same (its resolve is harmless;
    a page left open is not) and the reason, naming ``where``, for the log."""
    try:
        data = json.loads(text)
        since = data["since"]
        error = data.get("error")
        if not (since is None or isinstance(since, (int, float))) or not (error is None or isinstance(error, str)):
            raise ValueError("since must be a number or null and error text or null")
        return BlindState(since=since, paged=True, error=error), None
    except (TypeError, ValueError, KeyError) as exc:
        return (BlindState(paged=True, error="unreadable record"),
                f"{where}: not a monitor page record ({type(exc).__name__}: {exc}); taken as a sent page")


def resolves_blind_page(pages: Iterable[Mapping[str, Any]], namespace: str, shard_id: str) -> bool:
    """Whether ``pages`` (outbox entries a round took) hold the resolve of the monitor's page for
    ``shard_id``: it is then in the store's outbox, and a record kept elsewhere may go."""
    key = blind_dedup_key(namespace, shard_id)
    return any(entry["event"].get("dedup_key") == key and entry["event"].get("action") == "resolve"
               for entry in pages)
