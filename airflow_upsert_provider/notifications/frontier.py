"""Sending a frontier page: what ``engine.frontier.page_event`` composed, to PagerDuty and Slack.

Composition is the engine's (pure, tested there); this module only delivers it, through the
PagerDuty provider's Events API v2 hook (connection type ``pagerduty_events``: the integration
key in the password; an optional host such as ``https://events.eu.pagerduty.com`` for another
service region) and the Slack provider's incoming-webhook hook (connection type
``slackwebhook``).

Delivery policy, the same for both channels:

- 429 (rate limited), 5xx and connection failures are retried with exponential backoff
  (a 429's ``Retry-After`` is honoured up to the backoff cap); the providers' own retries are
  switched off so that one policy decides. Every request is cut after
  ``alerts.PAGE_REQUEST_TIMEOUT_SECONDS``, so one delivery lasts at most
  ``alerts.max_delivery_seconds()``, less than the outbox lease.
- Each channel is tried whatever another did; a failure names the channels that got the page
  (``PageDeliveryError.delivered``), so that a later round sends it only to the others.
- Any other 4xx (400: the event is malformed, 403/404: a wrong key or webhook) is not retried:
  sending it again cannot succeed.
- The integration key and the webhook URL are secrets: they are masked in task logs and never
  appear in a message or an exception of this module.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow.sdk import BaseNotifier
from airflow.sdk.exceptions import AirflowException

from airflow_upsert_provider.engine.common.retry import PAGE_DELIVERY, RetryPolicy
from airflow_upsert_provider.engine.common.time_text import format_duration_to_the_second
from airflow_upsert_provider.engine.errors import ConfigurationError
from airflow_upsert_provider.engine.frontier.alerts import PAGE_REQUEST_TIMEOUT_SECONDS, check_delivery_policy
from airflow_upsert_provider.engine.sources.lag import format_pending

log = logging.getLogger(__name__)

DEFAULT_PAGERDUTY_EVENTS_URL = "https://events.pagerduty.com"
CHANNEL_PAGERDUTY = "pagerduty"
CHANNEL_SLACK = "slack"

DEFAULT_RETRY = PAGE_DELIVERY


class PageDeliveryError(AirflowException):
    """A page could not be delivered. ``retryable``: the last failure was a 429, a 5xx or a
    connection failure (the attempts ran out); otherwise the receiver refused the event."""

    def __init__(self, channel: str, message: str, *, status: int | None, attempts: int, retryable: bool,
                 delivered: Sequence[Delivery] = ()) -> None:
        super().__init__(f"{channel}: {message} (after {attempts} attempt{'s' if attempts != 1 else ''})")
        self.channel = channel
        self.status = status
        self.attempts = attempts
        self.retryable = retryable
        # The channels the page did reach in the same delivery (a later one sends it only to the others).
        self.delivered = list(delivered)


class _Retryable(Exception):
    """One failed attempt worth repeating."""

    def __init__(self, message: str, status: int | None = None, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after


class _Refused(Exception):
    """One failed attempt that repeating cannot fix."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Delivery:
    """One channel's delivery of one page."""

    channel: str
    action: str
    dedup_key: str
    attempts: int
    status: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "channel": self.channel, "action": self.action, "dedup_key": self.dedup_key,
            "attempts": self.attempts, "status": self.status,
        }


def is_retryable_status(status: int) -> bool:
    """429 and 5xx are worth retrying; every other failure status is a refusal."""
    return status == 429 or 500 <= status <= 599


def _mask(secret: str | None) -> None:
    if secret:
        from airflow.sdk.log import mask_secret

        mask_secret(secret)


async def _with_retries(channel: str, attempt: Callable[[], Any], policy: RetryPolicy,
                        sleep: Callable[[float], Any] = asyncio.sleep) -> tuple[Any, int]:
    """Run ``attempt`` (a coroutine function) under ``policy``; return its result and the
    number of attempts it took."""
    from tenacity import AsyncRetrying, RetryError, retry_if_exception_type, stop_after_attempt
    from tenacity.wait import wait_base, wait_exponential

    class _WaitHonouringRetryAfter(wait_base):
        # Exponential backoff, lengthened to a 429's Retry-After (both capped).
        def __init__(self) -> None:
            self._exponential = wait_exponential(multiplier=policy.base_seconds, max=policy.max_wait_seconds,
                                                 exp_base=policy.multiplier)

        def __call__(self, retry_state: Any) -> float:
            wait = self._exponential(retry_state)
            failure = retry_state.outcome.exception() if retry_state.outcome else None
            if isinstance(failure, _Retryable) and failure.retry_after:
                wait = max(wait, min(failure.retry_after, policy.max_wait_seconds))
            return wait

    def _before_sleep(retry_state: Any) -> None:
        failure = retry_state.outcome.exception()
        log.warning("%s: attempt %d of %d failed (%s); retrying in %.2fs", channel, retry_state.attempt_number,
                    policy.max_attempts, failure, retry_state.next_action.sleep)

    retrying = AsyncRetrying(
        stop=stop_after_attempt(policy.max_attempts),
        wait=_WaitHonouringRetryAfter(),
        retry=retry_if_exception_type(_Retryable),
        before_sleep=_before_sleep,
        sleep=sleep,
        reraise=False,
    )
    try:
        async for attempt_state in retrying:
            with attempt_state:
                result = await attempt()
            if not attempt_state.retry_state.outcome.failed:
                return result, attempt_state.retry_state.attempt_number
    except RetryError as exc:
        last = exc.last_attempt.exception()
        raise PageDeliveryError(channel, str(last), status=getattr(last, "status", None),
                                attempts=exc.last_attempt.attempt_number, retryable=True) from None
    except _Refused as exc:
        raise PageDeliveryError(channel, str(exc), status=exc.status,
                                attempts=retrying.statistics.get("attempt_number", 1), retryable=False) from None
    raise AssertionError("unreachable: tenacity ended without an outcome")  # pragma: no cover


def _http_status(exc: BaseException) -> int | None:
    # The HTTP provider turns a failed response into HttpErrorException("<status>:<reason>").
    head = str(exc).split(":", 1)[0].strip()
    return int(head) if head.isdigit() else None


@dataclass
class PagerDutySender:
    """Events API v2 through ``PagerdutyEventsAsyncHook``.

    :param integration_key: the routing key (a secret).
    :param base_url: the Events API's base URL (another service region, or a test server).
    """

    integration_key: str = field(repr=False)
    base_url: str = DEFAULT_PAGERDUTY_EVENTS_URL

    @classmethod
    def from_connection(cls, conn_id: str) -> PagerDutySender:
        from airflow.sdk import BaseHook

        conn = BaseHook.get_connection(conn_id)
        if not conn.password:
            raise AirflowException(
                f"pagerduty_events_conn_id {conn_id!r}: the connection has no integration key (password)"
            )
        _mask(conn.password)
        host = (conn.host or "").strip()
        if host and "://" not in host:
            host = f"{conn.schema or 'https'}://{host}"
        if host and conn.port:
            host = f"{host}:{conn.port}"
        return cls(integration_key=conn.password, base_url=host.rstrip("/") or DEFAULT_PAGERDUTY_EVENTS_URL)

    async def send(self, event: Mapping[str, Any], policy: RetryPolicy = DEFAULT_RETRY,
                   sleep: Callable[[float], Any] = asyncio.sleep) -> Delivery:
        import aiohttp
        from airflow.providers.pagerduty.hooks.pagerduty_events import prepare_event_data

        # The provider's event body; the request is ours: the hook's exception carries neither a
        # 429's Retry-After nor a time limit.
        body = {"event_action": event["action"], "routing_key": self.integration_key,
                "dedup_key": event["dedup_key"],
                **prepare_event_data(summary=event["summary"], severity=event["severity"],
                                     source=event.get("source") or "airflow-upsert-provider",
                                     custom_details=event.get("custom_details"), group=event.get("group") or None,
                                     component=event.get("component") or None, action=event["action"],
                                     dedup_key=event["dedup_key"], links=list(event.get("links") or []) or None)}
        timeout = aiohttp.ClientTimeout(total=PAGE_REQUEST_TIMEOUT_SECONDS)

        async def attempt() -> str:
            try:
                async with aiohttp.ClientSession(timeout=timeout) as session:
                    async with session.post(f"{self.base_url}/v2/enqueue", json=body) as response:
                        status = response.status
                        if status < 300:
                            reply = await response.json(content_type=None)
                            return str((reply or {}).get("dedup_key") or event["dedup_key"])
                        retry_after = _retry_after(response.headers.get("Retry-After"))
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                raise _Retryable(f"connection failed: {type(exc).__name__}") from None
            if is_retryable_status(status):
                raise _Retryable(f"HTTP {status}", status, retry_after)
            raise _Refused(f"HTTP {status}: the Events API refused the event", status)

        dedup_key, attempts = await _with_retries(CHANNEL_PAGERDUTY, attempt, policy, sleep)
        return Delivery(CHANNEL_PAGERDUTY, event["action"], dedup_key or event["dedup_key"], attempts, 202)


def _retry_after(value: str | None) -> float | None:
    """A Retry-After header in seconds (the delta form); None when absent or a date."""
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    return seconds if seconds is not None and seconds >= 0 else None


def slack_message(event: Mapping[str, Any]) -> dict[str, Any]:
    """The Slack message of a page: the summary, then the facts the on-call engineer needs."""
    details = event.get("custom_details") or {}
    icon = ":rotating_light:" if event["action"] == "trigger" else ":white_check_mark:"
    lines = [f"{icon} *{event['summary']}*"]
    stuck = details.get("stuck_seconds")
    facts = [
        ("shard", details.get("shard")), ("status", details.get("status")), ("rule", details.get("rule")),
        ("upper", details.get("upper")), ("last advance", details.get("last_advance")),
        ("stuck", None if stuck is None else format_duration_to_the_second(stuck)),
        ("lag", None if details.get("lag") is None
         else format_pending(details["lag"], details.get("lag_unit"), details.get("lag_seconds"))),
        ("writers running", details.get("writers_running")),
    ]
    lines += [f"• {name}: `{value}`" for name, value in facts if value is not None]
    for reason in list(details.get("reasons") or [])[:5]:
        lines.append(f"> {reason}")
    for link in event.get("links") or []:
        lines.append(f"<{link.get('href')}|{link.get('text') or link.get('href')}>")
    lines.append(f"dedup key `{event['dedup_key']}`")
    return {"text": "\n".join(lines)}


@dataclass
class SlackSender:
    """Slack incoming webhook through ``SlackWebhookHook``. Build it with
    :meth:`from_connection` in the task's thread: the connection is read there, and only the
    HTTP request runs in a worker thread."""

    slack_webhook_conn_id: str
    client: Any = field(default=None, repr=False)

    @classmethod
    def from_connection(cls, conn_id: str) -> SlackSender:
        from airflow.providers.slack.hooks.slack_webhook import SlackWebhookHook

        # The webhook client logs its URL at debug level: a logger of our own at INFO keeps it out.
        quiet = logging.getLogger("airflow_upsert_provider.notifications.slack_client")
        quiet.setLevel(logging.INFO)
        hook = SlackWebhookHook(slack_webhook_conn_id=conn_id, retry_handlers=[], logger=quiet,
                                timeout=int(PAGE_REQUEST_TIMEOUT_SECONDS))
        _mask(hook.get_connection(conn_id).password)
        return cls(conn_id, hook.get_conn())

    def _post(self, body: dict[str, Any]) -> tuple[int, str]:
        client = self.client or SlackSender.from_connection(self.slack_webhook_conn_id).client
        response = client.send_dict(body)
        return response.status_code, str(response.body)[:200]

    async def send(self, event: Mapping[str, Any], policy: RetryPolicy = DEFAULT_RETRY,
                   sleep: Callable[[float], Any] = asyncio.sleep) -> Delivery:
        body = slack_message(event)

        async def attempt() -> int:
            try:
                status, text = await asyncio.to_thread(self._post, body)
            except (OSError, TimeoutError) as exc:
                raise _Retryable(f"connection failed: {type(exc).__name__}") from None
            if status == 200:
                return status
            if is_retryable_status(status):
                raise _Retryable(f"HTTP {status}", status)
            raise _Refused(f"HTTP {status}: the webhook refused the message ({text})", status)

        status, attempts = await _with_retries(CHANNEL_SLACK, attempt, policy, sleep)
        return Delivery(CHANNEL_SLACK, event["action"], event["dedup_key"], attempts, status)


async def asend_page(event: Mapping[str, Any], *, pagerduty: PagerDutySender | None = None,
                     slack: SlackSender | None = None, policy: RetryPolicy = DEFAULT_RETRY,
                     skip: Sequence[str] = ()) -> list[Delivery]:
    """Deliver one page to every configured channel but those in ``skip`` (they have it
    already). PagerDuty first: it is the page; Slack is its copy for the channel. Every
    channel is tried; when one failed, :class:`PageDeliveryError` (the first failure) is raised
    after the others, naming in ``delivered`` those that got the page."""
    if event.get("action") not in ("trigger", "resolve"):
        raise ValueError(f"page action must be 'trigger' or 'resolve', got {event.get('action')!r}")
    if not event.get("dedup_key"):
        raise ValueError("page dedup_key is required")
    deliveries: list[Delivery] = []
    failures: list[PageDeliveryError] = []
    for channel, sender in ((CHANNEL_PAGERDUTY, pagerduty), (CHANNEL_SLACK, slack)):
        if sender is None or channel in skip:
            continue
        try:
            deliveries.append(await sender.send(event, policy))
        except PageDeliveryError as exc:
            failures.append(exc)
    if failures:
        failures[0].delivered = deliveries
        raise failures[0]
    return deliveries


def _run(coroutine: Any) -> Any:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    # Called from inside an event loop: run in a thread of our own rather than block that loop.
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = asyncio.run(coroutine)
        except BaseException as exc:  # re-raised in the caller's thread
            outcome["error"] = exc

    thread = threading.Thread(target=target, name="frontier-page")
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def send_page(event: Mapping[str, Any], *, pagerduty_events_conn_id: str | None = None,
              slack_webhook_conn_id: str | None = None, policy: RetryPolicy = DEFAULT_RETRY,
              skip: Sequence[str] = ()) -> list[Delivery]:
    """Deliver ``event`` (from ``frontier.page_event``) through the given connections, but not
    to the channels in ``skip``; no connection given, nothing is sent (an empty list)."""
    pagerduty = PagerDutySender.from_connection(pagerduty_events_conn_id) if pagerduty_events_conn_id else None
    slack = SlackSender.from_connection(slack_webhook_conn_id) if slack_webhook_conn_id else None
    return _run(asend_page(event, pagerduty=pagerduty, slack=slack, policy=policy, skip=skip))


def channels(pagerduty_events_conn_id: str | None, slack_webhook_conn_id: str | None) -> Sequence[str]:
    """The channels a page goes to with these connections (for messages and reports)."""
    return [name for name, conn in ((CHANNEL_PAGERDUTY, pagerduty_events_conn_id),
                                    (CHANNEL_SLACK, slack_webhook_conn_id)) if conn]



class FrontierPageNotifier(BaseNotifier):
    """A notifier (``on_*_callback``) delivering a frontier page composed by
    ``frontier.page_event``, e.g. the ``page`` a ``FrontierStallSensor`` round left in XCom.

    :param event: the page (templated: a dict, or a Jinja expression rendering one).
    :param pagerduty_events_conn_id: `pagerduty_events` connection; None: not sent there.
    :param slack_webhook_conn_id: `slackwebhook` connection; None: not sent there.
    :param delivery_policy: how the page is retried on a channel that answers 429, 5xx or not at
        all (default ``retry.PAGE_DELIVERY``); one whose longest delivery exceeds the outbox
        lease is refused.
    """

    template_fields = ("event", "pagerduty_events_conn_id", "slack_webhook_conn_id")

    def __init__(self, *, event: Any, pagerduty_events_conn_id: str | None = None,
                 slack_webhook_conn_id: str | None = None, delivery_policy: RetryPolicy = DEFAULT_RETRY) -> None:
        super().__init__()
        try:
            self.delivery_policy = check_delivery_policy(delivery_policy)
        except ConfigurationError as exc:
            raise ValueError(f"FrontierPageNotifier: {exc}") from None
        self.event = event
        self.pagerduty_events_conn_id = pagerduty_events_conn_id
        self.slack_webhook_conn_id = slack_webhook_conn_id

    def notify(self, context: Any) -> None:
        event = self.event
        if isinstance(event, str):
            import json

            event = json.loads(event)
        if not isinstance(event, Mapping):
            raise ValueError(f"event must be a page (a mapping), got {type(event).__name__}")
        send_page(event, pagerduty_events_conn_id=self.pagerduty_events_conn_id or None,
                  slack_webhook_conn_id=self.slack_webhook_conn_id or None, policy=self.delivery_policy)
