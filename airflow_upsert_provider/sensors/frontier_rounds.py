"""What the frontier sensor and its deferrable trigger decide from one evaluation round, and how
they name its settings: shared by both, so that neither imports the other's module for it."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow.sdk.exceptions import AirflowFailException

from airflow_upsert_provider.engine.common.time_text import format_duration_to_the_second, format_timestamp
from airflow_upsert_provider.engine.sources.lag import format_pending
from airflow_upsert_provider.hooks.upsert import UpsertShardHook
from airflow_upsert_provider.operators.arguments import parse_bool, parse_int, parse_seconds

if TYPE_CHECKING:

    from airflow_upsert_provider.engine.frontier.model import StallSettings
    from airflow_upsert_provider.engine.frontier.observations import EvaluationRound

# Settings fields the sensor passes to the rules; the rules' defaults apply to those left unset.
SECONDS_SETTINGS = ("window_seconds", "cadence_seconds", "stall_multiplier", "min_stall_seconds",
                    "stale_after_seconds", "lag_seconds_objective", "max_stopped_seconds")
DEFAULT_WATCH_SECONDS = 900.0
DEFAULT_POKE_INTERVAL = 30.0

# What a round means for the task.
WATCH = "watch"          # keep poking
PAGE = "page"            # a page was triggered: send it, fail the task
RESOLVE = "resolve"      # the open page is resolved: send it, keep watching
FIRING = "firing"        # the incident's page is already open and the breach persists: fail, no page
NOT_FOUND = "not_found"  # no such shard: fail
BLIND = "blind"          # (trigger events) evaluations keep failing, or work again: the monitor's own page


def stall_settings(values: Mapping[str, Any]) -> StallSettings:
    """``StallSettings`` from operator arguments (numbers or templated strings); unset ones keep
    the rules' defaults. A bad value fails without retry, naming the field."""
    from airflow_upsert_provider.engine.errors import ConfigurationError
    from airflow_upsert_provider.engine.frontier.model import StallSettings

    kwargs: dict[str, Any] = {}
    for name in SECONDS_SETTINGS:
        value = parse_seconds(values.get(name), name)
        if value is not None:
            kwargs[name] = value
    if values.get("page_on_lagging") is not None:
        kwargs["page_on_lagging"] = parse_bool(values["page_on_lagging"], "page_on_lagging")
    breaches = parse_int(values.get("consecutive_breaches"), "consecutive_breaches", minimum=1)
    if breaches is not None:
        kwargs["consecutive_breaches"] = breaches
    try:
        return StallSettings(**kwargs)
    except (ConfigurationError, ValueError, TypeError) as exc:
        raise AirflowFailException(f"frontier stall settings: {exc}") from None


def settings_to_dict(settings: StallSettings) -> dict[str, Any]:
    return settings.to_dict()


def settings_from_dict(values: Mapping[str, Any]) -> StallSettings:
    from airflow_upsert_provider.engine.frontier.model import StallSettings

    return StallSettings.from_dict(values)


def evaluate_round(upsert_conn_id: str, shard: str, settings: StallSettings, observer: str,
                   now: float | None = None, kafka_conn_id: str | None = None,
                   compose_page: Callable[..., dict] | None = None, blind: Any = None,
                   namespace: str = "") -> EvaluationRound:
    """One evaluation round of ``shard`` on the `upsert` connection (no Spark). A Kafka shard
    is observed with the client config of ``kafka_conn_id`` (default: the upsert connection's
    ``kafka_conn_id``); when it cannot be observed the round says why and judges what writers
    recorded. ``compose_page``, ``blind`` (the failed evaluations before this round) and
    ``namespace``: see ``observations.evaluate_shard`` (the outbox, the monitor's own page)."""
    from airflow_upsert_provider.engine.common.metrics import frontier_metrics
    from airflow_upsert_provider.engine.errors import UpsertError
    from airflow_upsert_provider.engine.frontier.observations import evaluate_shard
    from airflow_upsert_provider.metrics import send as send_metrics
    from airflow_upsert_provider.operators.errors import to_airflow_error

    hook = UpsertShardHook(upsert_conn_id=upsert_conn_id)
    try:
        round_ = evaluate_shard(hook.get_consensus(), hook.get_blob(), shard, settings, observer=observer, now=now,
                                open_shard=lambda shard_id: hook.open_shard(shard_id, kafka_conn_id=kafka_conn_id),
                                compose_page=compose_page, blind=blind, namespace=namespace)
        send_metrics(lambda: frontier_metrics(round_.evaluation.to_dict()))
        return round_
    except UpsertError as exc:
        raise to_airflow_error(exc, hook) from exc
    finally:
        hook.close()


def _iso(ts: float | None) -> str:
    return format_timestamp(ts, zulu=True)


def describe_breach(evaluation: Mapping[str, Any]) -> str:
    """What the on-call engineer reads first, as a short block: shard, status, upper and
    since when it has not moved on the first line; then what is pending (in the source's unit)
    and for how long, the window, the rule and why, one a line."""
    window = evaluation.get("window") or {}
    # Stuck time counts from when records became pending at this upper, not from the last advance.
    stuck_since = (evaluation.get("thresholds") or {}).get("stall_started_at") or evaluation.get("last_advance_at")
    lines = [
        f"shard {evaluation['shard_id']}: frontier {evaluation['status']}; upper {evaluation.get('upper')} stuck "
        f"since {_iso(stuck_since)} ({format_duration_to_the_second(evaluation.get('stuck_seconds'))}; "
        f"last advance {_iso(evaluation.get('last_advance_at'))})",
        f"behind: {format_pending(evaluation.get('lag'), evaluation.get('lag_unit'), evaluation.get('lag_seconds'))}",
        f"window {format_duration_to_the_second(window.get('seconds'))} from {_iso(window.get('start'))} to "
        f"{_iso(window.get('end'))} "
        f"({window.get('samples')} samples)",
        f"rule: {evaluation.get('rule')}",
    ]
    reasons = list(evaluation.get("reasons") or [])
    if reasons:
        lines.append("why: " + "; ".join(reasons[:3]))
    return "\n  ".join(lines)


@dataclass(frozen=True)
class Decision:
    """What one round means for the task, with the page it made (``frontier.page_event``), the
    outbox pages it must deliver (``pages``: {"id", "leased_until", "event"}, oldest first, its
    own page last) and the failure message. JSON-able (``to_dict``): the trigger hands it to
    the worker."""

    kind: str
    round: dict[str, Any]
    page: dict[str, Any] | None = None
    message: str = ""
    pages: tuple[dict[str, Any], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "round": self.round, "page": self.page, "message": self.message,
                "pages": [dict(entry) for entry in self.pages]}

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> Decision:
        return cls(values["kind"], values["round"], values.get("page"), values.get("message", ""),
                   tuple(values.get("pages") or ()))


def page_composer(settings: StallSettings, *, namespace: str = "", links: Sequence[dict] = (),
                  run_ids: Sequence[str] = ()) -> Callable[..., dict]:
    """What a round puts into the outbox for a trigger or resolve (``frontier.page_event``)."""
    from airflow_upsert_provider.engine.frontier.pages import page_event

    def compose(evaluation: Any, state: Any, action: str) -> dict:
        return page_event(evaluation, state, action, settings, namespace=namespace, links=links, run_ids=run_ids)

    return compose


def decide(round_: EvaluationRound, settings: StallSettings, *, namespace: str = "",
           links: Sequence[dict] = (), run_ids: Sequence[str] = ()) -> Decision:
    """The task's reading of one evaluation round (pure)."""
    from airflow_upsert_provider.engine.frontier.model import FrontierStatus

    evaluation = round_.evaluation
    as_dict = round_.to_dict()
    pages = tuple(round_.pages)
    if round_.action in ("trigger", "resolve"):
        # The round's own page, as it went into the outbox (it is sent after any older one of its key).
        page = round_.page
        if round_.action == "trigger":
            return Decision(PAGE, as_dict, page, describe_breach(evaluation.to_dict()), pages)
        return Decision(RESOLVE, as_dict, page, page["summary"], pages)
    if evaluation.status == FrontierStatus.NOT_FOUND:
        return Decision(NOT_FOUND, as_dict, None,
                        f"shard {evaluation.shard_id!r} does not exist in the consensus store (shard)", pages)
    if evaluation.breach and round_.state.firing:
        page_note = ("its page, decided earlier and left undelivered, is sent now" if pages else
                     f"its page is open since {_iso(round_.state.incident_started_at)} (same incident: not paged again)")
        return Decision(FIRING, as_dict, None, f"{describe_breach(evaluation.to_dict())}\n  page: {page_note}", pages)
    return Decision(WATCH, as_dict, None, "", pages)
