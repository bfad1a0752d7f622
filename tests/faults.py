"""Deterministic consensus faults on a real store: a connection that drops right after a
commit, and an outage of the store for the next statements that read."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy import event

from airflow_upsert_provider.engine.store.consensus import Consensus
from airflow_upsert_provider.engine.errors import ConsensusOutcomeUnknown


class StoreOutage:
    """Makes ``consensus`` behave as if its connection dropped at chosen moments.

    - ``drop_after_next_append(then_fail_reads=n)``: the next ``compare_and_append`` commits
      for real, then raises what the store raises when the connection drops while it commits
      (:class:`ConsensusOutcomeUnknown`: the client never sees the result), and the next ``n`` SELECT statements after it fail the same way (the store
      is down while the writer reads the outcome back), through an engine event hook, so
      every code path that reads sees it.
    """

    def __init__(self, consensus: Consensus) -> None:
        self.consensus = consensus
        self.failed_reads = 0
        self._reads_to_fail = 0
        self._drop_next_append = False
        self._reads_after_drop = 0
        self._real_append = consensus.compare_and_append
        consensus.compare_and_append = self._append
        event.listen(consensus.engine, "before_cursor_execute", self._before_execute)

    def _lost(self) -> Exception:
        return self.consensus.engine.dialect.loaded_dbapi.OperationalError(
            "server closed the connection unexpectedly"
        )

    def _append(self, *args, **kwargs):
        result = self._real_append(*args, **kwargs)
        if self._drop_next_append:
            self._drop_next_append = False
            self._reads_to_fail = self._reads_after_drop
            raise ConsensusOutcomeUnknown(
                "consensus store failed while committing, so the change may or may not have landed: "
                "server closed the connection unexpectedly"
            ) from sa.exc.OperationalError("COMMIT", {}, self._lost())
        return result

    def _before_execute(self, conn, cursor, statement, parameters, context, executemany):
        if self._reads_to_fail and statement.lstrip().upper().startswith("SELECT"):
            self._reads_to_fail -= 1
            self.failed_reads += 1
            raise self._lost()

    def drop_after_next_append(self, *, then_fail_reads: int = 0) -> "StoreOutage":
        self._drop_next_append = True
        self._reads_after_drop = then_fail_reads
        return self

    def end(self) -> None:
        self._reads_to_fail = 0
        self._drop_next_append = False
