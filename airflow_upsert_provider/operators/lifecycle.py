"""Stream lifecycle and recovery operators: stop, resume, and a recovery's begin, seek, resume.

Thin over ``engine/store/streams.py`` and ``engine/lifecycle/recovery.py``: each parses its parameters,
makes one transition through ``UpsertShardHook`` and returns a JSON-able report (pushed to
XCom as ``return_value``) holding the stream afterwards under ``stream`` and its recovery
``epoch``. The actor each transition records is the task instance
(``airflow:<dag_id>:<run_id>:<task_id>[:<map_index>]:try<N>``), so the stream's history says
which task try stopped, resumed or recovered it.

The engine decides every transition by compare-and-set and enforces the recovery order
(restore or begin, then seek, then resume) whoever runs the steps. A refused transition
(``TransitionRefused``), a stream that does not let a writer write (``StreamNotWritable``)
and source segments gone before a seek (``SourceSegmentsMissing``) fail the task without
retry, with the engine's message: it names the status, who set it, when and why.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from airflow_upsert_provider.engine.errors import UpsertError
from airflow_upsert_provider.hooks.upsert import DEFAULT_CONN_ID, UpsertShardHook
from airflow_upsert_provider.lineage import capture, operator_lineage
from airflow_upsert_provider.links import ShardPageLink
from airflow_upsert_provider.operators.arguments import optional_text, parse_int, parse_seconds
from airflow_upsert_provider.operators.errors import raise_from, to_airflow_error
from airflow_upsert_provider.operators.upsert import writer_id_for

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_upsert_provider.engine.store.streams import TransitionResult


def actor_for(context: Mapping[str, Any] | None, task: BaseOperator) -> str:
    """The identity a transition records: the task instance's try, like a writer's id.
    Outside a task run (no ``ti`` in the context) the task id alone."""
    ti = (context or {}).get("ti")
    if ti is None:
        return f"airflow:{task.task_id}"
    return writer_id_for(ti.dag_id, ti.run_id, ti.task_id, ti.map_index, ti.try_number)


def transition_report(result: TransitionResult) -> dict[str, Any]:
    """What a lifecycle task pushes to XCom: the transition and the stream afterwards."""
    state = result.state
    return {
        "shard": state.shard_id,
        "action": result.action,
        "changed": result.changed,
        "from": result.before.status.value,
        "status": state.status.value,
        "epoch": state.epoch,
        "stream": state.to_dict(),
    }


def parse_epoch(value: Any) -> int | None:
    """A recovery epoch (an integer, or its string as a template renders it); None when unset
    (the engine then acts on the open recovery)."""
    return parse_int(value, "epoch", minimum=1)


class _StreamOperator(BaseOperator):
    """Builds the hook, runs :meth:`run` with the task's identity, maps engine errors."""

    template_fields: Sequence[str] = ("shard", "reason")
    ui_color = "#f4e6d2"
    operator_extra_links = (ShardPageLink(),)

    def __init__(
        self, *, shard: str, reason: str = "", upsert_conn_id: str = DEFAULT_CONN_ID, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.shard = shard
        self.reason = reason
        self.upsert_conn_id = upsert_conn_id

    def execute(self, context: Context) -> dict[str, Any]:
        actor = actor_for(context, self)
        hook = UpsertShardHook(upsert_conn_id=self.upsert_conn_id)
        try:
            result = self.run(hook, actor)
        except UpsertError as exc:
            raise_from(to_airflow_error(exc, hook), exc)
        finally:
            hook.close()
        stream = result.get("stream", {})
        self.log.info(
            "%s of shard %s by %s: stream %s (epoch %s, version %s)",
            self.task_type, self.shard, actor, stream.get("status"), stream.get("epoch"), stream.get("version"),
        )
        return result

    @property
    def reason_text(self) -> str:
        return optional_text(self.reason) or ""

    def run(self, hook: UpsertShardHook, actor: str) -> dict[str, Any]:  # pragma: no cover - abstract
        raise NotImplementedError


class StopStreamOperator(_StreamOperator):
    """Stop the shard's stream: READY -> STOPPING, let the batch in hand commit (at most
    ``drain_seconds``), then STOPPING -> STOPPED at the version the stop wrote. Runs started
    afterwards fail with the stop's actor, time and reason until a resume. A writer still
    staging when the drain ends is fenced at its commit: nothing is lost, its batch runs after
    the resume. Stopping a stopped stream changes nothing; a stop during a recovery is refused.
    Returns the transition and the stream afterwards (``status``, ``epoch``, ``stream``).

    :param shard: the shard id (templated).
    :param reason: why, recorded in the stream's history and shown by refused runs (templated).
    :param drain_seconds: how long to wait for the batch in hand (templated; seconds or a
        timedelta); default 60.
    :param upsert_conn_id: the `upsert` connection.
    """

    template_fields: Sequence[str] = ("shard", "reason", "drain_seconds")

    def __init__(
        self,
        *,
        shard: str,
        reason: str = "",
        drain_seconds: Any = None,
        upsert_conn_id: str = DEFAULT_CONN_ID,
        **kwargs: Any,
    ) -> None:
        super().__init__(shard=shard, reason=reason, upsert_conn_id=upsert_conn_id, **kwargs)
        self.drain_seconds = drain_seconds
        # A plain flag, not an Event: Airflow deep-copies operators, and a lock does not copy.
        # The drain polls at most every DRAIN_POLL_SECONDS, so a kill ends it within that.
        self._killed = False

    def run(self, hook: UpsertShardHook, actor: str) -> dict[str, Any]:
        from airflow_upsert_provider.engine.store import streams

        drain = parse_seconds(self.drain_seconds, "drain_seconds")

        def clock() -> float:
            # A killed task ends the drain at once and finalizes (see on_kill).
            return math.inf if self._killed else time.monotonic()

        def on_wait(remaining: float) -> None:
            self.log.info("shard %s: waiting up to %.0fs for the batch in hand to commit", self.shard, remaining)

        result = streams.stop_and_finalize(
            hook.get_consensus(),
            self.shard,
            actor,
            self.reason_text,
            drain_seconds=streams.DEFAULT_DRAIN_SECONDS if drain is None else drain,
            sleep=self._drain_sleep,
            clock=clock,
            on_wait=on_wait,
            staging_written_at=lambda ts: self._staging_written_at(hook, ts),
        )
        return transition_report(result)

    def _staging_written_at(self, hook: UpsertShardHook, ts: int) -> float | None:
        """For the drain: when batch ``ts``'s staging files were last written. A blob root the
        stop cannot use only takes that sign away (the binding's age still counts): a stop does
        not depend on the blob."""
        from airflow_upsert_provider.engine.store import streams

        try:
            blob = hook.get_blob()
        except UpsertError:
            return None
        return streams.staging_written_at(blob, self.shard)(ts)

    def _drain_sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def on_kill(self) -> None:
        """End the drain now and finalize the stop: the stream ends STOPPED as asked, and a
        writer still in its batch is fenced at its commit (nothing is lost). Killed before the
        stop itself, nothing was changed; killed by a timeout, the stream stays STOPPING and
        the retry finishes the stop."""
        self.log.info("on_kill: ending the drain of shard %s; the stop is finalized now", self.shard)
        self._killed = True


class ResumeStreamOperator(_StreamOperator):
    """Resume a stopped stream: STOPPED -> READY. Resuming a READY stream changes nothing; a
    stream still STOPPING or in a recovery is refused (a recovery ends with
    ``ResumeAfterRecoveryOperator``). Returns the transition and the stream afterwards.

    :param shard: the shard id (templated).
    :param reason: why, recorded in the stream's history (templated).
    :param upsert_conn_id: the `upsert` connection.
    """

    def run(self, hook: UpsertShardHook, actor: str) -> dict[str, Any]:
        from airflow_upsert_provider.engine.store import streams

        return transition_report(streams.resume(hook.get_consensus(), self.shard, actor, self.reason_text))


class BeginRecoveryOperator(_StreamOperator):
    """Open a recovery: READY or STOPPED -> RECOVERING in a new epoch. From here no writer
    that started earlier commits, and nothing writes until the seek of this epoch and the
    resume have run. Returns the transition with the new ``epoch`` (also under
    ``stream``), for the seek and resume tasks to pass on.

    :param shard: the shard id (templated).
    :param reason: why, recorded in the stream's history (templated).
    :param upsert_conn_id: the `upsert` connection.
    """

    def run(self, hook: UpsertShardHook, actor: str) -> dict[str, Any]:
        from airflow_upsert_provider.engine.store import streams

        return transition_report(streams.begin_recovery(hook.get_consensus(), self.shard, actor, self.reason_text))


class SeekSourceOperator(_StreamOperator):
    """Seek the source for the shard's upper in a recovery: position every partition where
    the next batch starts, verify that every segment the shard still has to read from there
    is present, and record that the seek of this epoch completed. Refused outside a recovery
    or for another epoch; fails, changing nothing, when segments at or after the seek point
    are gone (the message names the first). Returns ``epoch``, ``upper``, ``position``,
    ``segments_ahead``, ``checked`` and ``stream``.

    :param shard: the shard id (templated).
    :param epoch: the recovery epoch this seek belongs to (templated), usually pulled from
        the task that opened it: ``{{ ti.xcom_pull(task_ids='restore')['stream']['epoch'] }}``;
        unset: the open recovery.
    :param upsert_conn_id: the `upsert` connection.
    """

    template_fields: Sequence[str] = ("shard", "epoch")

    def __init__(
        self, *, shard: str, epoch: int | str | None = None, upsert_conn_id: str = DEFAULT_CONN_ID, **kwargs: Any
    ) -> None:
        super().__init__(shard=shard, upsert_conn_id=upsert_conn_id, **kwargs)
        self.epoch = epoch

    def run(self, hook: UpsertShardHook, actor: str) -> dict[str, Any]:
        from airflow_upsert_provider.engine.lifecycle.recovery import seek

        epoch = parse_epoch(self.epoch)
        shard = hook.open_shard(self.shard)
        result = seek(shard, epoch=epoch, actor=actor).to_dict()
        self._lineage = capture(self, hook, result, shard=shard)
        return result

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """OpenLineage: the source positioned, the shard, its frontier (docs/lineage.md)."""
        return operator_lineage(getattr(self, "_lineage", None))


class ResumeAfterRecoveryOperator(_StreamOperator):
    """End a recovery: RECOVERING -> READY, only if the seek of the same epoch completed
    (else refused, naming what is missing). Returns the transition and the stream afterwards.

    :param shard: the shard id (templated).
    :param epoch: the recovery epoch to resume (templated), the one the seek ran in; unset:
        the open recovery. A different open epoch (someone began another recovery) is refused.
    :param upsert_conn_id: the `upsert` connection.
    """

    template_fields: Sequence[str] = ("shard", "epoch")

    def __init__(
        self, *, shard: str, epoch: int | str | None = None, upsert_conn_id: str = DEFAULT_CONN_ID, **kwargs: Any
    ) -> None:
        super().__init__(shard=shard, upsert_conn_id=upsert_conn_id, **kwargs)
        self.epoch = epoch

    def run(self, hook: UpsertShardHook, actor: str) -> dict[str, Any]:
        from airflow_upsert_provider.engine.store import streams

        epoch = parse_epoch(self.epoch)
        return transition_report(streams.resume_after_recovery(hook.get_consensus(), self.shard, epoch, actor))
