"""ShardCommitTrigger: a shard's commits as events, for ``AssetWatcher`` (docs/events.md).

It polls the shard's upper in the consensus store (the engine's blocking reads in a thread)
and fires one event each time the upper passed the last one it reported, whoever committed:
a DAG's task, a continuous run, ``upsertctl``, another deployment. Each event carries the
commit-event contract (engine/common/commit_events.py): ``from_ts``, ``to_ts`` (exclusive),
``rows_out``, ``schema_version``, beside ``upper``, ``upper_before``, ``committed`` and
``rows_in``.

What it reported is kept in the watched Asset's state store (Airflow 3.3's
``asset_state_store``, injected by the triggerer), written before the event is yielded: a
restarted triggerer resumes from it and a ts is never reported twice (an event lost to a
triggerer crash in between is not sent again: at most once). Without a state store (a trigger
run outside an AssetWatcher) it is kept in memory.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent

# The Asset state store's key for the last upper reported.
REPORTED_UPPER_KEY = "upsert_reported_upper"


class ShardCommitTrigger(BaseEventTrigger):
    """Fire when the upper of ``shard`` passes the last upper reported.

    :param shard: the shard id.
    :param upsert_conn_id: the `upsert` connection of its store.
    :param after_upper: report commits from this upper on (every ts >= it); None (default):
        only commits made after the trigger first looked. Used until an upper was reported.
    :param poll_interval: seconds between two reads of the upper.
    """

    def __init__(
        self,
        *,
        shard: str,
        upsert_conn_id: str = "upsert_default",
        after_upper: int | None = None,
        poll_interval: float = 30.0,
    ) -> None:
        super().__init__()
        from airflow_upsert_provider.engine.config import validate_shard_id
        from airflow_upsert_provider.engine.errors import ConfigurationError

        validate_shard_id(shard)
        if after_upper is not None and (isinstance(after_upper, bool) or not isinstance(after_upper, int)
                                        or after_upper < 0):
            raise ConfigurationError(f"after_upper must be an integer >= 0 or None, not {after_upper!r}",
                                     field="after_upper")
        if isinstance(poll_interval, bool) or not isinstance(poll_interval, (int, float)) or not poll_interval > 0:
            raise ConfigurationError(f"poll_interval must be a number of seconds above 0, not {poll_interval!r}",
                                     field="poll_interval")
        self.shard = shard
        self.upsert_conn_id = upsert_conn_id
        self.after_upper = after_upper
        self.poll_interval = float(poll_interval)
        self._hook: Any = None

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {"shard": self.shard, "upsert_conn_id": self.upsert_conn_id, "after_upper": self.after_upper,
             "poll_interval": self.poll_interval},
        )

    # -- state ------------------------------------------------------------------------------

    async def _load_reported(self) -> int | None:
        if self.asset_state_store is None:
            return None
        value = await self.asset_state_store.aget(REPORTED_UPPER_KEY)
        return None if value is None else int(value)

    async def _save_reported(self, upper: int) -> None:
        if self.asset_state_store is not None:
            await self.asset_state_store.aset(REPORTED_UPPER_KEY, upper)

    # -- the store (blocking: run in a thread) ---------------------------------------------

    def _read(self, reported: int | None) -> tuple[int, dict[str, Any] | None]:
        """The store's upper, and the event for the commits since ``reported`` (None: none yet)."""
        from airflow_upsert_provider.engine.common.commit_events import committed_batch, next_commit_event
        from airflow_upsert_provider.engine.store.table_schemas import current_version
        from airflow_upsert_provider.hooks.upsert import UpsertShardHook

        if self._hook is None:
            self._hook = UpsertShardHook(upsert_conn_id=self.upsert_conn_id)
        consensus = self._hook.get_consensus()
        upper = consensus.get_shard(self.shard).upper
        if reported is None or upper <= reported:
            return upper, None
        records = consensus.batches(self.shard, from_ts=reported, below=upper)
        batches = [committed_batch(r.ts, r.stats, r.committed_at) for r in records]
        return upper, next_commit_event(self.shard, reported, upper, batches, current_version(consensus, self.shard))

    def _close(self) -> None:
        if self._hook is not None:
            self._hook.close()
            self._hook = None

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from airflow_upsert_provider.engine.errors import ConsensusUnavailable, ShardNotFound, first_line

        reported = await self._load_reported()
        if reported is None:
            reported = self.after_upper
        try:
            while True:
                try:
                    upper, event = await asyncio.to_thread(self._read, reported)
                except (ConsensusUnavailable, ShardNotFound) as exc:
                    # Watched for as long as the DAG is: a store that is down or a shard not
                    # created yet is waited for, and said so at every poll.
                    self.log.warning("shard %s: upper not read (%s: %s); polling again in %ss", self.shard,
                                     type(exc).__name__, first_line(exc), self.poll_interval)
                else:
                    if reported is None:
                        reported = upper  # commits from here on
                        await self._save_reported(reported)
                    elif event is not None:
                        reported = event["to_ts"]
                        # Saved first: a ts is reported at most once, also across a restart.
                        await self._save_reported(reported)
                        self.log.info("shard %s: committed ts %s to %s", self.shard, event["from_ts"],
                                      event["to_ts"] - 1)
                        yield TriggerEvent(event)
                await asyncio.sleep(self.poll_interval)
        finally:
            await asyncio.to_thread(self._close)
