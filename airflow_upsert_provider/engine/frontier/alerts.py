"""The alert state of a shard and its outbox, as pure decisions (invariant 15).

``AlertState`` is what a shard's evaluations carry from one to the next (the breach streak,
the firing page, the maxima and stall clock the rules need, the settings of the monitor that
judged); ``advance_alert`` turns an evaluation into a page action (trigger once per incident,
resolve when it is over); the outbox keeps the pages decided and not yet delivered:
``enqueue_page`` adds one and supersedes what it makes stale, ``take_pages`` leases the due
ones to a round, ``settle_pages`` records what each channel confirmed. The store shell
(``engine/frontier/observations.py``) saves the state by compare-and-set; the sensor sends.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Mapping, Sequence

from airflow_upsert_provider.engine.common.retry import PAGE_DELIVERY, RetryPolicy
from airflow_upsert_provider.engine.errors import ConfigurationError
from airflow_upsert_provider.engine.frontier.model import Evaluation, StallSettings, _require


@dataclass(frozen=True)
class AlertState:
    """The evaluation state of one shard across evaluations; persisted as JSON in consensus."""

    shard_id: str
    consecutive_breaches: int = 0
    firing: bool = False                 # a page was triggered and not resolved yet
    firing_status: str | None = None
    incident_started_at: float | None = None
    max_upper: int = -1                  # highest upper ever observed (REWOUND stays until regained)
    max_high_watermark: dict[str, int] = field(default_factory=dict)
    last_status: str | None = None
    last_evaluated_at: float | None = None
    pages_sent: int = 0                  # triggers that reached a channel (see settle_pages)
    # Pages decided and not yet confirmed delivered, oldest first: {"id", "leased_until",
    # "event"} (see enqueue_page / take_pages). Saved with the decision that made them, so a
    # worker that dies before sending leaves them for the next round.
    outbox: tuple[dict, ...] = ()
    outbox_dropped: int = 0              # pages dropped from a full outbox, never delivered
    # The settings (StallSettings.to_dict) of the evaluation that saved this state and who made
    # it (its observer): the shard page judges with them, so that it and the monitor agree.
    # None in rows written before they were kept.
    settings: dict | None = None
    evaluated_by: str | None = None
    last_sent_at: float | None = None    # when a page of this shard was last delivered
    # Why the latest pages settled reached no channel (no PagerDuty or Slack connection is
    # configured: they were only logged); None once a page reaches one.
    unsent_reason: str | None = None
    # The stall clock carried across evaluations, so that stall time is never capped by the
    # window: the upper the last judging evaluation saw, and since when records were pending
    # at it (None: nothing pending). The upper never moves back, so while it stays at
    # stall_upper those records are still pending.
    stall_upper: int | None = None
    pending_since: float | None = None
    # The monitor's own page for this shard (BlindState as a dict) while it is open.
    blind: dict | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "shard_id": self.shard_id,
            "consecutive_breaches": self.consecutive_breaches,
            "firing": self.firing,
            "firing_status": self.firing_status,
            "incident_started_at": self.incident_started_at,
            "max_upper": self.max_upper,
            "max_high_watermark": dict(self.max_high_watermark),
            "last_status": self.last_status,
            "last_evaluated_at": self.last_evaluated_at,
            "pages_sent": self.pages_sent,
            "outbox": [dict(entry) for entry in self.outbox],
            "outbox_dropped": self.outbox_dropped,
            "settings": None if self.settings is None else dict(self.settings),
            "evaluated_by": self.evaluated_by,
            "last_sent_at": self.last_sent_at,
            "unsent_reason": self.unsent_reason,
            "stall_upper": self.stall_upper,
            "pending_since": self.pending_since,
            "blind": None if self.blind is None else dict(self.blind),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "AlertState":
        owner = "AlertState"
        try:
            started = d.get("incident_started_at")
            evaluated = d.get("last_evaluated_at")
            sent = d.get("last_sent_at")
            return cls(
                shard_id=str(_require(d, owner, "shard_id")),
                consecutive_breaches=int(d.get("consecutive_breaches", 0)),
                firing=bool(d.get("firing", False)),
                firing_status=d.get("firing_status"),
                incident_started_at=None if started is None else float(started),
                max_upper=int(d.get("max_upper", -1)),
                max_high_watermark={str(k): int(v) for k, v in (d.get("max_high_watermark") or {}).items()},
                last_status=d.get("last_status"),
                last_evaluated_at=None if evaluated is None else float(evaluated),
                pages_sent=int(d.get("pages_sent", 0)),
                outbox=tuple(_outbox_entry(entry) for entry in d.get("outbox") or ()),
                outbox_dropped=int(d.get("outbox_dropped", 0)),
                settings=None if d.get("settings") is None else dict(d["settings"]),
                evaluated_by=d.get("evaluated_by"),
                last_sent_at=None if sent is None else float(sent),
                unsent_reason=d.get("unsent_reason"),
                stall_upper=None if d.get("stall_upper") is None else int(d["stall_upper"]),
                pending_since=None if d.get("pending_since") is None else float(d["pending_since"]),
                blind=None if d.get("blind") is None else dict(d["blind"]),
            )
        except (TypeError, ValueError, AttributeError, KeyError) as e:
            raise ConfigurationError(f"{owner}: unreadable alert state: {e}", field="alert_state") from e


DEFAULT_SETTINGS_NOTE = "no monitor has evaluated this shard yet: judged with the default thresholds"


def judging_settings(state: AlertState) -> tuple[StallSettings, str | None]:
    """The settings to judge a shard with outside an evaluation round (the shard page): those
    its monitor last evaluated with (kept in its alert state), so that both reach one verdict;
    the rules' defaults, with a note saying so, for a shard no monitor has evaluated or whose
    recorded settings cannot be read. Fields a newer version recorded are left out."""
    if state.settings is None:
        return StallSettings(), DEFAULT_SETTINGS_NOTE
    known = {f.name for f in fields(StallSettings)}
    try:
        return StallSettings.from_dict({k: v for k, v in state.settings.items() if k in known}), None
    except (ConfigurationError, TypeError) as e:
        return StallSettings(), f"the monitor's recorded settings cannot be read ({e}): judged with the default thresholds"


def _outbox_entry(entry: Mapping[str, Any]) -> dict[str, Any]:
    return {"id": str(entry["id"]), "leased_until": float(entry.get("leased_until") or 0.0),
            "event": dict(entry["event"]), "delivered": [str(c) for c in entry.get("delivered") or ()],
            "taken": bool(entry.get("taken", entry.get("leased_until"))),
            # Rows written before it was kept: a resolve followed an open incident.
            "open_before": bool(entry.get("open_before", entry["event"].get("action") == "resolve"))}


def advance_alert(state: AlertState, evaluation: Evaluation,
                  settings: StallSettings) -> tuple[AlertState, str | None]:
    """The alert state after ``evaluation`` and the page action it calls for.

    "trigger": the breach reached ``settings.consecutive_breaches`` consecutive evaluations and
    no page is firing; "resolve": a page is firing and this evaluation does not breach; None
    otherwise (a breach that persists does not page twice)."""
    if evaluation.shard_id != state.shard_id:
        raise ConfigurationError(f"the evaluation of shard {evaluation.shard_id!r} cannot advance the alert state "
                                 f"of shard {state.shard_id!r}", field="shard_id")
    max_upper = state.max_upper
    candidates = [u for u in (evaluation.max_upper, evaluation.upper) if u is not None]
    if candidates:
        max_upper = max([max_upper] + candidates)
    max_hw = dict(state.max_high_watermark)
    for p, hw in (evaluation.max_high_watermark or {}).items():
        if hw > max_hw.get(p, -1):
            max_hw[p] = hw
    common = dict(max_upper=max_upper, max_high_watermark=max_hw, last_status=evaluation.status.value,
                  last_evaluated_at=evaluation.evaluated_at, settings=settings.to_dict())
    if evaluation.stall_upper is not None:
        # An evaluation that did not reach the stall clock (STALE: nothing seen) leaves it as it was.
        common.update(stall_upper=evaluation.stall_upper, pending_since=evaluation.pending_since)

    if evaluation.breach:
        streak = state.consecutive_breaches + 1
        started = state.incident_started_at if state.incident_started_at is not None else evaluation.evaluated_at
        if not state.firing and streak >= settings.consecutive_breaches:
            return replace(state, consecutive_breaches=streak, firing=True, firing_status=evaluation.status.value,
                           incident_started_at=started, **common), "trigger"
        return replace(state, consecutive_breaches=streak, incident_started_at=started, **common), None

    new = replace(state, consecutive_breaches=0, firing=False, firing_status=None, incident_started_at=None,
                  **common)
    return new, ("resolve" if state.firing else None)


# ---------------------------------------------------------------------------------------------
# The outbox: a page is decided, saved, then sent


# Every HTTP request of a page's delivery is cut after this long (the senders pass it on).
PAGE_REQUEST_TIMEOUT_SECONDS = 10.0
# The channels a page may go to (PagerDuty, then Slack).
PAGE_CHANNELS = 2


def max_delivery_seconds(policy: RetryPolicy = PAGE_DELIVERY, *, channels: int = PAGE_CHANNELS,
                         request_timeout: float = PAGE_REQUEST_TIMEOUT_SECONDS) -> float:
    """The longest one page's delivery can last: on every channel every attempt times out and
    every wait between attempts is the longest allowed (a Retry-After is capped at it too)."""
    return channels * (policy.max_attempts * request_timeout + (policy.max_attempts - 1) * policy.max_wait_seconds)


# How long the round that took a page from the outbox owns its delivery before another round
# may take it: longer than one bounded delivery, so that a live sender is never overtaken.
DEFAULT_DELIVERY_SECONDS = max_delivery_seconds()
OUTBOX_LEASE_SECONDS = DEFAULT_DELIVERY_SECONDS + 60.0


def check_delivery_policy(policy: Any) -> RetryPolicy:
    """``policy`` if a page's delivery under it ends within the outbox lease (a longer one could
    be overtaken by a round that takes the page again and sends it twice); otherwise a
    ConfigurationError naming ``delivery_policy``."""
    if not isinstance(policy, RetryPolicy):
        raise ConfigurationError(f"delivery_policy must be a RetryPolicy, got {type(policy).__name__}",
                                 field="delivery_policy")
    longest = max_delivery_seconds(policy)
    if longest > DEFAULT_DELIVERY_SECONDS:
        raise ConfigurationError(
            f"delivery_policy {policy} may deliver for {longest:g}s, longer than the {DEFAULT_DELIVERY_SECONDS:g}s "
            f"the outbox lease ({OUTBOX_LEASE_SECONDS:g}s) covers: fewer attempts or shorter waits",
            field="delivery_policy")
    return policy


# An outbox never grows beyond this many pages (the oldest go first, counted in the state's
# outbox_dropped and logged): a channel that refuses every page must not grow the row without bound.
MAX_OUTBOX = 20


def _key(entry: Mapping[str, Any]) -> Any:
    return entry["event"].get("dedup_key")


def enqueue_page(state: AlertState, event: Mapping[str, Any], page_id: str,
                 now: float = 0.0) -> tuple[AlertState, tuple[dict, ...]]:
    """``state`` with ``event`` added to its outbox, due at once, and the pages dropped to make
    room (oldest first, beyond MAX_OUTBOX; counted in ``outbox_dropped``).

    A newer event supersedes the older pages of its dedup key that no channel confirmed and
    that no live round is delivering (lease run out at ``now``): receivers see only the newest.
    A resolve is dropped too when no receiver can hold an open incident of its key (the
    trigger it supersedes was never taken by a round, and nothing before it was open): nobody
    was paged, nothing to resolve. Otherwise it is sent alone, never after a stale trigger.
    Pages that reached a channel are never superseded: they go to the others first, in order.
    Each page records whether receivers may hold an open incident before it (``open_before``)."""
    key = event.get("dedup_key")
    # The newest pages of this key back to the first that reached a channel or is being delivered.
    gone: list[int] = []
    for i in reversed(range(len(state.outbox))):
        entry = state.outbox[i]
        if _key(entry) != key:
            continue
        if entry.get("delivered") or entry.get("leased_until", 0.0) > now:
            break
        gone.insert(0, i)
    superseded = [state.outbox[i] for i in gone]
    outbox = [entry for i, entry in enumerate(state.outbox) if i not in gone]
    if superseded:
        # What receivers held before the first superseded page, or what a taken trigger may have opened.
        open_before = superseded[0]["open_before"] or any(
            entry.get("taken") and entry["event"].get("action") == "trigger" for entry in superseded)
    else:
        kept = [entry for entry in outbox if _key(entry) == key]
        # After the pages still to go; with none, a resolve closes what a delivered trigger opened.
        open_before = (kept[-1]["event"].get("action") == "trigger") if kept else event.get("action") == "resolve"
    if open_before or event.get("action") != "resolve":
        outbox.append({"id": page_id, "leased_until": 0.0, "event": dict(event), "delivered": [], "taken": False,
                       "open_before": open_before})
    dropped = tuple(outbox[:-MAX_OUTBOX]) if len(outbox) > MAX_OUTBOX else ()
    return replace(state, outbox=tuple(outbox[len(dropped):]),
                   outbox_dropped=state.outbox_dropped + len(dropped)), dropped


def take_pages(state: AlertState, now: float,
               lease_seconds: float = OUTBOX_LEASE_SECONDS) -> tuple[AlertState, tuple[dict, ...]]:
    """The pages of the outbox that are due at ``now``, at most one per dedup key, the oldest:
    a page is never sent before an older one of its key was delivered (a resolve never
    overtakes its trigger). Due: new, or its taker's lease ran out (it died, or could not
    deliver). They are leased to the caller until ``now + lease_seconds``; whoever saves the
    returned state by compare-and-set owns their delivery."""
    taken: list[dict] = []
    outbox: list[dict] = []
    seen: set = set()
    for entry in state.outbox:
        key = _key(entry)
        if key not in seen:
            seen.add(key)
            if entry.get("leased_until", 0.0) <= now:
                entry = {**entry, "leased_until": now + lease_seconds, "taken": True}
                taken.append(entry)
        outbox.append(entry)
    if not taken:
        return state, ()
    return replace(state, outbox=tuple(outbox)), tuple(taken)


def settle_pages(state: AlertState, delivered: Sequence[str] = (), released: Sequence[str] = (),
                 sent_at: float | None = None, *, reached: Mapping[str, Sequence[str]] | None = None,
                 unsent_reason: str | None = None) -> AlertState:
    """``state`` without the ``delivered`` pages, and with the ``released`` ones due again at
    once (their delivery failed: the next round sends them), each remembering the channels it
    ``reached`` (page id -> channels) so that no channel gets it twice. ``sent_at``: when the
    delivered pages reached a channel (None: they were only logged, ``unsent_reason`` says why,
    or nothing was delivered). Only triggers that reached a channel count in ``pages_sent``."""
    reached = reached or {}

    def release(entry: dict) -> dict:
        channels = list(entry.get("delivered") or [])
        channels += [c for c in reached.get(entry["id"], ()) if c not in channels]
        return {**entry, "leased_until": 0.0, "delivered": channels}

    outbox = tuple(release(entry) if entry["id"] in released else entry
                   for entry in state.outbox if entry["id"] not in delivered)
    done = [entry for entry in state.outbox if entry["id"] in delivered]
    if not done:
        return replace(state, outbox=outbox)
    if sent_at is None:
        return replace(state, outbox=outbox, unsent_reason=unsent_reason or state.unsent_reason)
    triggers = sum(1 for entry in done if entry["event"].get("action") == "trigger")
    return replace(state, outbox=outbox, last_sent_at=sent_at, pages_sent=state.pages_sent + triggers,
                   unsent_reason=None)
