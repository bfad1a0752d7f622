"""FrontierTrigger: the deferrable half of ``FrontierStallSensor``.

In the triggerer it runs an evaluation round every ``poke_interval`` seconds (the engine's
blocking calls in a thread) until a round must be acted on: a page to trigger or resolve, a
breach whose page is already open, a shard that does not exist, or the end of the watch. It
then yields one event carrying the round and the page already composed
(``frontier.page_event``); the worker sends it and fails or finishes the task. Sending from the
worker keeps one delivery path (retries, re-arming a page that was not delivered) for every
mode.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent


class FrontierTrigger(BaseTrigger):
    """Evaluate a shard's frontier every ``poke_interval`` seconds until ``watch_until`` (unix
    seconds) or until a round must be acted on.

    :param shard: the shard id.
    :param upsert_conn_id: the `upsert` connection.
    :param settings: the stall settings as a dict (``dataclasses.asdict(StallSettings)``).
    :param observer: who observes (``sensor:<dag>/<run>/<task>``).
    :param watch_until: when the watch ends healthy.
    :param poke_interval: seconds between rounds.
    :param namespace, links, run_ids: what the page carries.
    :param last_round: the round the worker made before deferring (the event's round when the
        watch ends before any round here).
    :param kafka_conn_id: the `kafka` connection of a Kafka shard (None: the upsert connection's).
    :param blind: the failed evaluations so far (``frontier.BlindState`` as a dict).
    :param blind_limit: how long evaluations may fail before the monitor's own page.
    """

    def __init__(
        self,
        *,
        shard: str,
        upsert_conn_id: str,
        settings: Mapping[str, Any],
        observer: str,
        watch_until: float,
        poke_interval: float,
        namespace: str = "",
        links: Sequence[dict] = (),
        run_ids: Sequence[str] = (),
        last_round: Mapping[str, Any] | None = None,
        kafka_conn_id: str | None = None,
        blind: Mapping[str, Any] | None = None,
        blind_limit: float | None = None,
    ) -> None:
        super().__init__()
        self.shard = shard
        self.upsert_conn_id = upsert_conn_id
        self.settings = dict(settings)
        self.observer = observer
        self.watch_until = float(watch_until)
        self.poke_interval = float(poke_interval)
        self.namespace = namespace
        self.links = [dict(link) for link in links]
        self.run_ids = list(run_ids)
        self.last_round = dict(last_round) if last_round is not None else None
        self.kafka_conn_id = kafka_conn_id
        self.blind = dict(blind or {})
        self.blind_limit = blind_limit

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "shard": self.shard, "upsert_conn_id": self.upsert_conn_id, "settings": self.settings,
                "observer": self.observer, "watch_until": self.watch_until, "poke_interval": self.poke_interval,
                "namespace": self.namespace, "links": self.links, "run_ids": self.run_ids,
                "last_round": self.last_round, "kafka_conn_id": self.kafka_conn_id, "blind": self.blind,
                "blind_limit": self.blind_limit,
            },
        )

    def _evaluate(self, now: float, blind: Any = None) -> dict[str, Any]:
        # Blocking: the store and the source directory. Runs in a worker thread.
        from airflow_upsert_provider.sensors.frontier_rounds import decide, evaluate_round, page_composer, settings_from_dict

        settings = settings_from_dict(self.settings)
        page_args = dict(namespace=self.namespace, links=self.links, run_ids=self.run_ids)
        round_ = evaluate_round(self.upsert_conn_id, self.shard, settings, self.observer, now=now,
                                kafka_conn_id=self.kafka_conn_id, compose_page=page_composer(settings, **page_args),
                                blind=blind, namespace=self.namespace)
        return decide(round_, settings, **page_args).to_dict()

    def _blind_event(self, blind: Any, action: str, now: float, limit: float,
                     last: Mapping[str, Any] | None) -> dict[str, Any]:
        import dataclasses

        from airflow_upsert_provider.engine.frontier.blind import BlindState, blind_page_event
        from airflow_upsert_provider.sensors.frontier_rounds import BLIND

        page = blind_page_event(blind, action, now, namespace=self.namespace, shard_id=self.shard,
                                limit_seconds=limit)
        after = blind if action == "trigger" else BlindState()
        return {"kind": BLIND, "page": page, "blind": dataclasses.asdict(after), "round": last,
                "message": page["summary"]}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from airflow_upsert_provider.sensors.frontier_rounds import WATCH

        from airflow_upsert_provider.engine.frontier.blind import BlindState, advance_blind
        from airflow_upsert_provider.sensors.frontier_rounds import settings_from_dict

        last = self.last_round
        blind = BlindState(**self.blind)
        limit = (self.blind_limit if self.blind_limit is not None
                 else settings_from_dict(self.settings).stale_limit_seconds)
        while True:
            started = time.time()
            try:
                decision = await asyncio.to_thread(self._evaluate, started, blind)
            except Exception as exc:  # noqa: BLE001 - retried here; paged when it lasts (the monitor is blind)
                cause = exc.__cause__ if exc.__cause__ is not None else exc
                text = getattr(cause, "message", None) or str(cause)
                error = f"{type(cause).__name__}: {(text.splitlines() or [''])[0][:300]}"
                self.log.warning("shard %s: frontier evaluation failed: %s", self.shard, error)
                blind, action = advance_blind(blind, started, error, limit)
                if action is not None:
                    yield TriggerEvent(self._blind_event(blind, action, started, limit, last))
                    return
                if time.time() >= self.watch_until:  # the worker turns it into a retryable failure
                    yield TriggerEvent({"kind": "error", "message": error, "round": last})
                    return
                await asyncio.sleep(self.poke_interval)
                continue
            # It works again: a monitor page that was sent is resolved through the round's outbox pages.
            blind = BlindState()
            last = decision["round"]
            if decision["kind"] != WATCH or decision.get("pages"):
                # Something to act on, or outbox pages to deliver: the worker sends pages.
                yield TriggerEvent(decision)
                return
            if time.time() >= self.watch_until:
                yield TriggerEvent(decision)
                return
            await asyncio.sleep(max(0.0, min(self.poke_interval - (time.time() - started),
                                             self.watch_until - time.time())))
