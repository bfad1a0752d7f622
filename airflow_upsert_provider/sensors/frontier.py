"""FrontierStallSensor: a shard's stalled frontier turns into a page and a failed task.

Every poke is one evaluation round of the engine (``observations.evaluate_shard``): observe
the shard, record the observation, read the window, apply the stall rules
(``engine/frontier/rules.py``) and advance the shard's alert state in consensus by compare-and-set.
The round that wrote a page action owns it, so two sensors on one shard never both page.

What the sensor does with a round:

- ``trigger`` (a breach repeated ``consecutive_breaches`` times and no page open): send the
  page (PagerDuty, Slack), then fail the task without retry, naming the shard, its upper, since
  when it has not moved, how far behind it is (records and seconds), the window and the rule.
- ``resolve`` (a page is open and the frontier moves again): send the resolve, keep watching.
- a breach while the page is already open (the same incident): no second page, but the task
  fails again: a stalled frontier is never silent, not even in the Airflow UI.
- a shard that does not exist: fail without retry (a typo would otherwise watch nothing).
- otherwise keep watching; after ``watch_seconds`` succeed with the last round (XCom).

A page is decided, saved, then sent: the round that decides a trigger or resolve puts its page
into the shard's outbox in consensus in the same compare-and-set as the decision, and the task
delivers it and takes it out. A page that could not be delivered stays in the outbox, released
for the next round, and the task fails with a retryable error; a worker that died between the
decision and the delivery leaves it leased, and the first round after the lease
(``alerts.OUTBOX_LEASE_SECONDS``, longer than one bounded delivery) sends it. Pages of one dedup
key go strictly in order, one a round; each channel that got a page is recorded and never
sent it again.
"""

from __future__ import annotations

import time
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from airflow.configuration import conf
from airflow.sdk import BaseSensorOperator, PokeReturnValue
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from airflow_upsert_provider.engine.common.retry import PAGE_DELIVERY, RetryPolicy
from airflow_upsert_provider.engine.errors import ConfigurationError
from airflow_upsert_provider.engine.frontier.alerts import check_delivery_policy, max_delivery_seconds
from airflow_upsert_provider.engine.frontier.blind import (
    BlindState,
    advance_blind,
    blind_page_event,
    blind_record,
    blind_record_key,
    parse_blind_record,
    resolves_blind_page,
)
from airflow_upsert_provider.engine.sources.lag import format_pending
from airflow_upsert_provider.hooks.upsert import DEFAULT_CONN_ID, UpsertShardHook
from airflow_upsert_provider.links import ShardPageLink
from airflow_upsert_provider.operators.arguments import optional_text, parse_seconds
from airflow_upsert_provider.operators.errors import DesignedFailure, short_traceback
from airflow_upsert_provider.sensors.frontier_rounds import (
    BLIND,
    DEFAULT_POKE_INTERVAL,
    DEFAULT_WATCH_SECONDS,
    FIRING,
    NOT_FOUND,
    PAGE,
    RESOLVE,
    SECONDS_SETTINGS,
    WATCH,
    _iso,
    decide,
    Decision,
    evaluate_round,
    page_composer,
    settings_to_dict,
    stall_settings,
)

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_upsert_provider.engine.frontier.model import StallSettings


# Why a page reached nobody (kept in the alert state; the shard page and upsertctl show it).
NO_CHANNEL = "no PagerDuty or Slack connection is configured"


class FrontierStallSensor(BaseSensorOperator):
    """Watch a shard's frontier for ``watch_seconds``; page and fail when it stalls.

    :param shard: the shard id (templated).
    :param upsert_conn_id: the `upsert` connection.
    :param kafka_conn_id: the `kafka` connection whose extra is the client config of a Kafka
        shard's topic (templated; default: the upsert connection's ``kafka_conn_id``). Without
        one a Kafka shard cannot be observed: the round says so and judges what writers record.
    :param window_seconds: observations the rules look at (templated; default 900, or the stall
        threshold plus the stale limit when that is longer; a shorter window is refused).
    :param cadence_seconds: how often batches are expected, the micro-batch schedule (default 60).
    :param stall_multiplier: stalled after ``max(stall_multiplier * cadence, min_stall)`` without
        the upper moving while the source grew (default 3).
    :param min_stall_seconds: see ``stall_multiplier`` (default 300).
    :param stale_after_seconds: the newest observation older than this is STALE (default
        ``max(2 * cadence, 120)``).
    :param lag_seconds_objective: LAGGING when the oldest pending record is older than this.
    :param page_on_lagging: LAGGING pages (severity warning); default false.
    :param max_stopped_seconds: a stream STOPPED or RECOVERING longer than this pages.
    :param consecutive_breaches: breaching rounds in a row before a page (default 2).
    :param blind_page_seconds: when every evaluation fails this long (the consensus store is
        down, the connection is broken), the monitor pages that under its own dedup key
        for the shard (``blind.blind_dedup_key``) and keeps trying; the first evaluation that
        works again, in this run or a later one, resolves it (templated; default: the stale
        limit, ``max(2 * cadence, 120)``).
    :param watch_seconds: how long one run watches before it succeeds healthy (default 900; 0: one
        evaluation).
    :param pagerduty_events_conn_id: `pagerduty_events` connection (integration key); none: no page.
    :param slack_webhook_conn_id: `slackwebhook` connection; none: no Slack message.
    :param delivery_policy: how a page is retried on a channel that answers 429, 5xx or not at all
        (``RetryPolicy``; default ``retry.PAGE_DELIVERY``: 6 attempts, backoff from 1 s to 30 s). A
        policy whose longest delivery exceeds the outbox lease is refused.
    :param namespace: groups the shards of one deployment in the page's dedup key and group.
    :param deferrable: wait in the triggerer between rounds instead of a worker slot.
    """

    template_fields: Sequence[str] = (
        "shard", *SECONDS_SETTINGS, "page_on_lagging", "consecutive_breaches", "watch_seconds", "namespace",
        "blind_page_seconds",
        "pagerduty_events_conn_id", "slack_webhook_conn_id", "kafka_conn_id",
    )
    ui_color = "#f7d9d9"
    operator_extra_links = (ShardPageLink(),)

    def __init__(
        self,
        *,
        shard: str,
        upsert_conn_id: str = DEFAULT_CONN_ID,
        kafka_conn_id: str | None = None,
        window_seconds: Any = None,
        cadence_seconds: Any = None,
        stall_multiplier: Any = None,
        min_stall_seconds: Any = None,
        stale_after_seconds: Any = None,
        lag_seconds_objective: Any = None,
        page_on_lagging: Any = None,
        max_stopped_seconds: Any = None,
        consecutive_breaches: Any = None,
        blind_page_seconds: Any = None,
        watch_seconds: Any = DEFAULT_WATCH_SECONDS,
        pagerduty_events_conn_id: str | None = None,
        slack_webhook_conn_id: str | None = None,
        namespace: str = "",
        delivery_policy: RetryPolicy = PAGE_DELIVERY,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("poke_interval", DEFAULT_POKE_INTERVAL)
        for silencer in ("soft_fail", "never_fail", "silent_fail"):
            # Each would turn a page's failure (or an undelivered page) into a skip or a log line.
            if kwargs.get(silencer):
                raise ValueError(f"FrontierStallSensor {kwargs.get('task_id')!r}: {silencer} is not allowed: "
                                 "a stalled frontier must fail its task")
        try:
            self.delivery_policy = check_delivery_policy(delivery_policy)
        except ConfigurationError as exc:
            raise ValueError(f"FrontierStallSensor {kwargs.get('task_id')!r}: {exc}") from None
        super().__init__(**kwargs)
        self.shard = shard
        self.upsert_conn_id = upsert_conn_id
        self.kafka_conn_id = kafka_conn_id
        self.window_seconds = window_seconds
        self.cadence_seconds = cadence_seconds
        self.stall_multiplier = stall_multiplier
        self.min_stall_seconds = min_stall_seconds
        self.stale_after_seconds = stale_after_seconds
        self.lag_seconds_objective = lag_seconds_objective
        self.page_on_lagging = page_on_lagging
        self.max_stopped_seconds = max_stopped_seconds
        self.consecutive_breaches = consecutive_breaches
        self.blind_page_seconds = blind_page_seconds
        self.watch_seconds = watch_seconds
        self.pagerduty_events_conn_id = pagerduty_events_conn_id
        self.slack_webhook_conn_id = slack_webhook_conn_id
        self.namespace = namespace
        self.deferrable = deferrable
        # Wall clock of the rounds; tests inject their own (not a DAG argument: not serialized).
        self.clock: Callable[[], float] = time.time
        self._watch_started: float | None = None
        self._blind = BlindState()
        self._blind_record_read = False

    # -- arguments -----------------------------------------------------------------------------

    @property
    def settings(self) -> StallSettings:
        return stall_settings({name: getattr(self, name) for name in
                               (*SECONDS_SETTINGS, "page_on_lagging", "consecutive_breaches")})

    @property
    def watch(self) -> float:
        seconds = parse_seconds(self.watch_seconds, "watch_seconds")
        if seconds is None:
            raise AirflowFailException(f"watch_seconds must be a number of seconds >= 0, got {self.watch_seconds!r}")
        return seconds

    def blind_limit(self, settings: StallSettings) -> float:
        """How long every evaluation may fail before the monitor pages that."""
        seconds = parse_seconds(self.blind_page_seconds, "blind_page_seconds")
        return settings.stale_limit_seconds if seconds is None else seconds

    def _optional(self, value: Any) -> str | None:
        return optional_text(value)

    def observer(self, context: Context) -> str:
        ti = context.get("ti")
        if ti is None:
            return f"sensor:{self.task_id}"
        return f"sensor:{ti.dag_id}/{ti.run_id}/{ti.task_id}"

    def _links(self, context: Context) -> list[dict]:
        ti = context.get("ti")
        url = getattr(ti, "log_url", None) if ti is not None else None
        return [{"href": url, "text": "Airflow task log"}] if isinstance(url, str) and url.startswith("http") else []

    def _run_ids(self, context: Context) -> list[str]:
        run_id = context.get("run_id")
        return [run_id] if run_id else []

    # -- rounds ------------------------------------------------------------------------------

    def _round(self, context: Context, deadline: float | None = None) -> Decision:
        """One evaluation round. While evaluations fail it tries again every poke_interval
        until ``deadline`` (unix seconds; None: it fails at once), paging once the failures
        last ``blind_page_seconds`` and resolving that page when an evaluation works again."""
        settings = self.settings
        limit = self.blind_limit(settings)
        if not self._blind_record_read:
            self._blind_record_read = True
            self._take_blind_record()
        page_args = dict(namespace=self.namespace or "", links=self._links(context), run_ids=self._run_ids(context))
        while True:
            now = self.clock()
            try:
                round_ = evaluate_round(self.upsert_conn_id, self.shard, settings, self.observer(context), now=now,
                                        kafka_conn_id=self._optional(self.kafka_conn_id),
                                        compose_page=page_composer(settings, **page_args), blind=self._blind,
                                        namespace=self.namespace or "")
            except Exception as exc:  # noqa: BLE001 - a monitor that cannot evaluate must say so, and page
                cause = exc.__cause__ if exc.__cause__ is not None else exc  # the engine's error, if any
                text = getattr(cause, "message", None) or str(cause)
                error = f"{type(cause).__name__}: {(text.splitlines() or [''])[0][:300]}"
                self._blind, action = advance_blind(self._blind, now, error, limit)
                self.log.warning("shard %s: frontier evaluation failed since %s (%s); %s", self.shard,
                                 _iso(self._blind.since), error,
                                 "paged" if self._blind.paged else f"pages after {limit:g}s of failures")
                if action is not None:
                    self._send_blind(blind_page_event(self._blind, action, now, namespace=self.namespace or "",
                                                      shard_id=self.shard, limit_seconds=limit))
                if deadline is None or time.time() >= deadline:
                    raise AirflowException(
                        f"shard {self.shard}: the frontier cannot be evaluated since {_iso(self._blind.since)} "
                        f"({error}); " + ("the monitor's page was sent" if self._blind.paged
                                          else f"the monitor pages after {limit:g}s of failures")) from exc
                time.sleep(self.poke_interval)
                continue
            # It works again: the round put the resolve of the monitor's page, if one was sent
            # (by this run or an earlier one), into the outbox; it is delivered with its pages.
            self._blind = BlindState()
            break
        evaluation = round_.evaluation
        self.log.info(
            "shard %s: %s (upper %s, %s, breaches in a row %s, page %s)%s",
            evaluation.shard_id, getattr(evaluation.status, "value", evaluation.status), evaluation.upper,
            format_pending(evaluation.lag, evaluation.lag_unit, evaluation.lag_seconds),
            round_.state.consecutive_breaches,
            "open" if round_.state.firing else "none", f": {evaluation.rule}" if evaluation.breach else "",
        )
        return decide(round_, settings, **page_args)

    def act(self, decision: Decision) -> None:
        """Deliver the decision's outbox pages, then fail the task when it says so."""
        if resolves_blind_page(decision.pages, self.namespace or "", self.shard):
            # The resolve of the monitor's page is in the store's outbox now: it is delivered
            # from there, so the record kept outside the store has done its work.
            self._forget_blind_record()
        if decision.pages:
            self._deliver(decision)
        if decision.kind in (PAGE, FIRING, NOT_FOUND):
            # A designed failure: the block is the log's last word, the traceback short.
            self.log.error("%s", decision.message)
            raise DesignedFailure(decision.message)

    def _deliver(self, decision: Decision) -> None:
        """Send the outbox pages in order; each delivered one leaves the outbox. One that
        fails is released (with those after it) for the next round, and the task fails with a
        retryable error."""
        from airflow_upsert_provider.notifications.frontier import PageDeliveryError, channels, send_page

        pagerduty = self._optional(self.pagerduty_events_conn_id)
        slack = self._optional(self.slack_webhook_conn_id)
        entries = list(decision.pages)
        if not channels(pagerduty, slack):
            for entry in entries:
                self.log.warning("shard %s: %s, but %s: %s", self.shard, entry["event"]["action"], NO_CHANNEL,
                                 entry["event"]["summary"])
            self._settle([entry["id"] for entry in entries], [], unsent_reason=NO_CHANNEL)
            return
        delivered: list[str] = []
        longest = max_delivery_seconds(self.delivery_policy)
        for i, entry in enumerate(entries):
            event = entry["event"]
            if time.time() + longest > float(entry.get("leased_until") or 0.0):
                # Its lease could run out mid-delivery and another round take it: leave it to that round.
                self._settle(delivered, [e["id"] for e in entries[i:]], sent=True)
                self.log.warning("shard %s: the %s is left to the next round (its lease ends before a delivery "
                                 "could)", self.shard, event["action"])
                return
            try:
                deliveries = send_page(event, pagerduty_events_conn_id=pagerduty, slack_webhook_conn_id=slack,
                                       skip=entry.get("delivered") or (), policy=self.delivery_policy)
            except (PageDeliveryError, AirflowException) as exc:
                reached = {entry["id"]: [d.channel for d in getattr(exc, "delivered", ())]}
                released = self._settle(delivered, [e["id"] for e in entries[i:]], sent=True, reached=reached)
                raise AirflowException(
                    f"{decision.message or event['summary']}; the {event['action']} was NOT delivered ({exc}); "
                    + ("it stays in the outbox, re-armed: the next round sends it again" if released
                       else "it stays in the outbox: a round sends it again once its lease runs out")
                    + (f" (not again to {', '.join(reached[entry['id']])}, which got it)" if reached[entry["id"]]
                       else "")
                ) from None
            delivered.append(entry["id"])
            for delivery in deliveries:
                self.log.info("shard %s: %s sent to %s (dedup key %s, %d attempt(s))", self.shard, delivery.action,
                              delivery.channel, delivery.dedup_key, delivery.attempts)
        self._settle(delivered, [], sent=True)

    def _send_blind(self, event: dict[str, Any]) -> None:
        """Deliver the monitor's own page (not in the outbox: the store may be what is down).
        A trigger that was not delivered is decided again by the next failed evaluation."""
        from airflow_upsert_provider.notifications.frontier import PageDeliveryError, channels, send_page

        pagerduty = self._optional(self.pagerduty_events_conn_id)
        slack = self._optional(self.slack_webhook_conn_id)
        if not channels(pagerduty, slack):
            self.log.warning("%s, but no PagerDuty or Slack connection is configured", event["summary"])
            return
        try:
            send_page(event, pagerduty_events_conn_id=pagerduty, slack_webhook_conn_id=slack,
                      policy=self.delivery_policy)
        except (PageDeliveryError, AirflowException) as exc:
            if event["action"] == "trigger":
                self._blind = dataclasses.replace(self._blind, paged=False)
            raise AirflowException(f"{event['summary']}; the {event['action']} was NOT delivered ({exc})") from None
        if event["action"] == "trigger":
            self._record_blind()
        self.log.info("%s: %s sent (dedup key %s)", event["summary"], event["action"], event["dedup_key"])

    def _record_blind(self) -> None:
        """Keep the sent monitor page where a later run finds it: in an Airflow Variable named
        by its namespace and shard (``blind.blind_record_key``; Airflow's own database answers
        whenever a task runs, also when the consensus store refuses every write), and in the
        shard's alert state when the store takes the write. Whichever round evaluates the shard
        next resolves it."""
        from airflow.sdk import Variable

        from airflow_upsert_provider.engine.frontier.observations import record_blind

        key = blind_record_key(self.namespace or "", self.shard)
        try:
            Variable.set(key, blind_record(self._blind),
                         description=f"the frontier monitor's open 'monitor blind' page of shard {self.shard}: "
                                     "its first evaluation that works resolves it and deletes this")
        except Exception as exc:  # noqa: BLE001 - the page is sent; the store below may still keep it
            self.log.warning("shard %s: the monitor's page could not be recorded in Airflow Variable %r (%s: %s)",
                             self.shard, key, type(exc).__name__, exc)
        hook = UpsertShardHook(upsert_conn_id=self.upsert_conn_id)
        try:
            record_blind(hook.get_consensus(), self.shard, self._blind)
        except Exception as exc:  # noqa: BLE001 - the page is sent; its record is best effort
            self.log.warning("shard %s: the monitor's page could not be recorded in the store (%s: %s)",
                             self.shard, type(exc).__name__, exc)
        finally:
            hook.close()

    def _take_blind_record(self) -> None:
        """Take over the monitor's page an earlier run sent and recorded outside the store (see
        ``_record_blind``): this run's first evaluation that works resolves it."""
        from airflow.sdk import Variable

        key = blind_record_key(self.namespace or "", self.shard)
        try:
            text = Variable.get(key, default=None)
        except Exception as exc:  # noqa: BLE001 - the alert state may hold it too; evaluate all the same
            self.log.warning("shard %s: Airflow Variable %r (the monitor's open page, if any) could not be read "
                             "(%s: %s)", self.shard, key, type(exc).__name__, exc)
            return
        if text is None:
            return
        recorded, problem = parse_blind_record(text, f"Airflow Variable {key!r}")
        if problem:
            self.log.warning("shard %s: %s", self.shard, problem)
        self.log.info("shard %s: the monitor's page sent by an earlier run is open (Airflow Variable %r); the first "
                      "evaluation that works resolves it", self.shard, key)
        if not self._blind.paged:
            self._blind = recorded

    def _forget_blind_record(self) -> None:
        from airflow.sdk import Variable

        key = blind_record_key(self.namespace or "", self.shard)
        try:
            Variable.delete(key)
        except Exception as exc:  # noqa: BLE001 - a record left behind costs one more resolve, not a lost page
            self.log.info("shard %s: Airflow Variable %r was not deleted (%s: %s)", self.shard, key,
                          type(exc).__name__, exc)

    def _settle(self, delivered: list[str], released: list[str], sent: bool = False,
                reached: Mapping[str, list[str]] | None = None, unsent_reason: str | None = None) -> bool:
        """Record in the outbox what was delivered (``sent``: to a channel, not only logged) and
        what goes back; never raises: a page whose delivery could not be recorded is sent again
        later (at least once)."""
        from airflow_upsert_provider.engine.frontier.observations import settle_outbox

        hook = UpsertShardHook(upsert_conn_id=self.upsert_conn_id)
        try:
            return settle_outbox(hook.get_consensus(), self.shard, delivered=delivered, released=released,
                                 sent_at=time.time() if sent and delivered else None, reached=reached,
                                 unsent_reason=unsent_reason)
        except Exception as exc:  # noqa: BLE001 - the delivery happened (or not) whatever the store says
            self.log.warning("shard %s: the outbox could not be updated (%s: %s); its pages are sent again once "
                             "their lease runs out", self.shard, type(exc).__name__, exc)
            return False
        finally:
            hook.close()

    # -- poke and reschedule -------------------------------------------------------------------

    def _watch_start(self, context: Context) -> float:
        if self.reschedule:
            ti = context.get("ti")
            first = ti.get_first_reschedule_date(context) if ti is not None else None
            if first is not None:
                return first.timestamp()
        if self._watch_started is None:
            self._watch_started = time.time()
        return self._watch_started

    def poke(self, context: Context) -> PokeReturnValue:
        started = self._watch_start(context)
        decision = self._round(context, deadline=started + self.watch)
        self.act(decision)
        done = time.time() - started >= self.watch
        if done:
            self.log.info("shard %s: watched %.0fs; frontier %s", self.shard, self.watch, decision.round["status"])
        return PokeReturnValue(is_done=done, xcom_value=decision.round)

    # -- deferrable ----------------------------------------------------------------------------

    def execute(self, context: Context) -> Any:
        try:
            return self._execute(context)
        except DesignedFailure as failure:
            raise short_traceback(failure) from None

    def _execute(self, context: Context) -> Any:
        if not self.deferrable:
            return super().execute(context)
        watch_until = time.time() + self.watch
        try:
            decision = self._round(context)
        except AirflowException:
            if self._blind.since is None:
                raise
            # Evaluation failed: the trigger keeps trying, and pages if it keeps failing.
            self._defer(context, watch_until, {})
            return None  # pragma: no cover - defer() raises
        self.act(decision)
        self._defer(context, watch_until, decision.round)
        return None  # pragma: no cover - defer() raises

    def _defer(self, context: Context, watch_until: float, last_round: Mapping[str, Any]) -> None:
        from datetime import timedelta

        from airflow_upsert_provider.triggers.frontier import FrontierTrigger

        self.defer(
            trigger=FrontierTrigger(
                shard=self.shard, upsert_conn_id=self.upsert_conn_id, settings=settings_to_dict(self.settings),
                kafka_conn_id=self._optional(self.kafka_conn_id),
                observer=self.observer(context), watch_until=watch_until, poke_interval=self.poke_interval,
                namespace=self.namespace or "", links=self._links(context), run_ids=self._run_ids(context),
                last_round=dict(last_round), blind=dataclasses.asdict(self._blind),
                blind_limit=self.blind_limit(self.settings),
            ),
            method_name="execute_complete",
            timeout=timedelta(seconds=max(self.timeout, self.watch + 4 * self.poke_interval)),
            kwargs={"watch_until": watch_until},
        )

    def execute_complete(self, context: Context, event: dict[str, Any], watch_until: float | None = None) -> Any:
        try:
            return self._execute_complete(context, event, watch_until)
        except DesignedFailure as failure:
            raise short_traceback(failure) from None

    def _execute_complete(self, context: Context, event: dict[str, Any], watch_until: float | None = None) -> Any:
        if event.get("kind") == "error":
            raise AirflowException(f"shard {self.shard}: frontier evaluation failed in the trigger: {event['message']}")
        if event.get("kind") == BLIND:
            # The trigger's evaluations failed long enough (or work again after that): the
            # monitor's own page, then the watch goes on with the trigger's count of failures.
            self._blind = BlindState(**event["blind"])
            self._send_blind(event["page"])
            if watch_until is not None and time.time() < watch_until:
                self._defer(context, watch_until, event.get("round") or {})
            if event["page"]["action"] == "trigger":
                raise AirflowException(event["message"])
            return event.get("round")
        decision = Decision.from_dict(event)
        self.act(decision)
        if decision.kind in (RESOLVE, WATCH) and watch_until is not None and time.time() < watch_until:
            self._defer(context, watch_until, decision.round)
        self.log.info("shard %s: watch over; frontier %s", self.shard, decision.round["status"])
        return decision.round
