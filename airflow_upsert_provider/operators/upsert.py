"""MicroBatchUpsertOperator: runs micro-batches of one shard, in the worker or on a cluster."""

from __future__ import annotations

import datetime
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from airflow.sdk import Asset, BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from airflow_upsert_provider.assets import ASSET_SCHEME
from airflow_upsert_provider.engine.common.commit_events import CommittedBatch, commit_range, committed_batch
from airflow_upsert_provider.engine.common.metrics import batch_metrics, live_runs_metrics, outcome_unknown_metrics
from airflow_upsert_provider.engine.common.time_text import format_seconds
from airflow_upsert_provider.engine.errors import ConfigurationError, OutcomeUnknown, UpsertError
from airflow_upsert_provider.engine.sources.lag import format_lag
from airflow_upsert_provider.engine.table.shard import BAD_RECORD_MODES
from airflow_upsert_provider.engine.store.streams import require_ready
from airflow_upsert_provider.hooks.upsert import DEFAULT_CONN_ID, UpsertShardHook
from airflow_upsert_provider.lineage import capture, operator_lineage, parent_job_spark_conf
from airflow_upsert_provider.links import ShardPageLink
from airflow_upsert_provider.metrics import send as send_metrics
from airflow_upsert_provider.operators.arguments import (
    is_templated,
    optional_text,
    parse_bool,
    parse_choice,
    parse_duration,
    parse_int,
)
from airflow_upsert_provider.operators.errors import error_from_result, raise_from, to_airflow_error

if TYPE_CHECKING:
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
    from airflow.sdk import Context

    from airflow_upsert_provider.engine.table.shard import Shard

SPARK_MODES = ("in_process", "submit", "connect")


def _submit_hook_class() -> type[SparkSubmitHook]:
    """The Spark provider's ``SparkSubmitHook``, except that the ``env`` its ``submit`` is
    given is the whole environment of spark-submit: the provider's own would replace it with
    this process's plus ``env_vars``, and a connection's credentials are in neither."""
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    class EnvironmentSubmitHook(SparkSubmitHook):
        # Private: no public API keeps submit()'s env; this builder is where the provider sets it.
        def _build_spark_submit_command(self, application: str) -> list[str]:
            # Private: no public API builds the command (it also turns env_vars into --conf).
            command = super()._build_spark_submit_command(application)
            # The provider copied env_vars here, into what submit() would replace the given env
            # with; the env given already holds them. Private: no public API clears it.
            self._env = None
            return command

    return EnvironmentSubmitHook


LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")
# The Spark provider's master when the Spark connection is not defined.
PROVIDER_DEFAULT_MASTER = "yarn"


def driver_on_loopback(master: str) -> bool:
    """Whether a client-mode driver of ``master`` runs where only loopback must be used: a
    local master, or a standalone master (``spark://``, possibly several) on this machine's
    loopback. A YARN, Kubernetes or remote standalone cluster reaches the driver over the
    network, so it must not bind to loopback there."""
    if master.startswith("local"):
        return True
    if not master.startswith("spark://"):
        return False
    addresses = master[len("spark://"):].split(",")
    # host[:port], or [IPv6][:port]
    hosts = [address[:address.index("]") + 1] if address.startswith("[") and "]" in address
             else address.split(":")[0] for address in addresses]
    return all(host in LOOPBACK_HOSTS for host in hosts)


def submit_env_vars(master: str) -> dict[str, str]:
    """The variables spark-submit's driver (and, on YARN and Kubernetes, the Spark provider's
    ``--conf`` arguments) get in submit mode on ``master``. Nothing secret: on those masters
    they are command-line arguments. ``SPARK_LOCAL_IP`` only where the driver runs on loopback
    (:func:`driver_on_loopback`): on a cluster it would bind the driver (and the YARN
    application master) where no executor reaches it."""
    env_vars = {"PYSPARK_PYTHON": sys.executable}
    if driver_on_loopback(master):
        env_vars["SPARK_LOCAL_IP"] = os.environ.get("SPARK_LOCAL_IP", "127.0.0.1")
    return env_vars


def submit_master(hook: UpsertShardHook) -> str:
    """The master spark-submit runs on: the Spark connection's, or, when that connection is
    not defined, the Spark provider's own fallback (YARN), not the in-process default."""
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        hook.get_connection(hook.settings.spark_conn_id)
    except AirflowNotFoundException:
        return PROVIDER_DEFAULT_MASTER
    return hook.spark_master()


# connect mode without a connection: the server `upsertctl spark-server start` runs by default.
DEFAULT_CONNECT_ADDRESS = "sc://127.0.0.1:15002"


def shard_asset(upsert_conn_id: str, shard: str) -> Asset:
    """The Asset of a shard: ``upsert://<connection>/<shard>``; its events mean fresh data."""
    return Asset(f"{ASSET_SCHEME}://{upsert_conn_id}/{shard}")


def writer_id_for(dag_id: str, run_id: str, task_id: str, map_index: int, try_number: int) -> str:
    """One writer per task try: a retry is a new writer, and a zombie's commits stay
    recognisable by the try that made them."""
    mapped = f":{map_index}" if map_index is not None and map_index >= 0 else ""
    return f"airflow:{dag_id}:{run_id}:{task_id}{mapped}:try{try_number}"


OWN_COMMIT_OUTCOMES = ("committed", "already_committed")


def earlier_try_writer_ids(writer_id: str) -> list[str]:
    """The writer ids of the tries before ``writer_id`` of its task instance (as
    :func:`writer_id_for` makes them); none for a first try or another kind of writer."""
    task, _, try_number = writer_id.rpartition(":try")
    if not (task and try_number.isdigit()):
        return []
    return [f"{task}:try{n}" for n in range(1, int(try_number))]


class ProducerEvent(NamedTuple):
    """What a try's Asset event announces: its range starts at ``from_ts`` (it ends at the
    upper the try leaves); the rows are those of the batches this task instance committed."""

    from_ts: int
    rows_in: int
    rows_out: int


def producer_event(upper_at_start: int, own: Sequence[CommittedBatch],
                   earlier_tries: Sequence[CommittedBatch]) -> ProducerEvent | None:
    """The Asset event of a successful try, or None when none is due. Pure.

    ``own``: the batches this try committed (``committed``, or ``already_committed``: its own
    append found landed after a lost connection). ``earlier_tries``: the batches the failed
    earlier tries of this task instance committed, found in the store's batch history by their
    writer ids. A failed try registers no event, so whatever it committed is announced by the
    retry, whichever batches peers committed since: the range starts at the lowest such batch
    (or at the upper this try found) and ends at the upper it leaves, so it may hold peers'
    batches in between; its rows count this task instance's batches only. A batch only a
    peer persisted (``already_persisted``) is the peer's to announce: announcing it here too
    would start a DAG scheduled on the shard once more for a set of batches."""
    announced = [*own, *earlier_tries]
    if not announced:
        return None
    return ProducerEvent(
        from_ts=min([upper_at_start, *(b.ts for b in earlier_tries)]),
        rows_in=sum(int(b.rows_in or 0) for b in announced),
        rows_out=sum(int(b.rows_out or 0) for b in announced),
    )


def batch_line(batch: dict[str, Any]) -> str:
    """One batch's log line, its times formatted: ``batch ts=4 committed: rows in 120, out 118,
    rejected 0, lag 3 segments, 2.4s (bind 0.1s, stage 1.9s, commit 0.4s)``."""
    timings = ", ".join(f"{name} {format_seconds(seconds)}" for name, seconds in (batch.get("timings") or {}).items()
                        if isinstance(seconds, (int, float)))
    return (f"batch ts={batch['ts']} {batch['outcome']}: rows in {batch['rows_in']}, out {batch['rows_out']}, "
            f"rejected {batch['rejected']}, lag {format_lag(batch.get('lag'), batch.get('lag_unit') or '')}, "
            f"{format_seconds(batch['seconds'])}" + (f" ({timings})" if timings else ""))


def write_private_file(directory: str, name: str, text: str) -> str:
    """Write ``text`` to a new file readable and writable only by this user (mode 0600 from
    its creation, never wider); return its path."""
    path = os.path.join(directory, name)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        handle.write(text)
    return path


def package_zip(directory: str) -> str:
    """A zip of the ``airflow_upsert_provider`` package for ``--py-files``: what a cluster's
    executors need to import the engine."""
    import airflow_upsert_provider

    package_dir = os.path.dirname(os.path.abspath(airflow_upsert_provider.__file__))
    path = os.path.join(directory, "airflow_upsert_provider.zip")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for root, dirs, files in os.walk(package_dir):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            for name in files:
                if name.endswith(".py"):
                    full = os.path.join(root, name)
                    archive.write(full, os.path.relpath(full, os.path.dirname(package_dir)))
    return path


@dataclass(frozen=True)
class _RunPlan:
    """The parsed arguments of one task's run."""

    writer_id: str
    max_batches: int | None
    until_caught_up: bool
    max_files_per_batch: int | None
    on_bad_record: str
    # Seconds of continuous mode (batches back to back, the next slice prefetched); None: off.
    continuous_seconds: float | None = None


class MicroBatchUpsertOperator(BaseOperator):
    """Run micro-batches of a shard: one, ``max_batches``, or until the source is caught up.

    Safe under overlap (a backfill beside the schedule, a zombie beside its retry): every
    batch is bound once and committed by compare-and-append; a writer that loses reports
    ``already_persisted``. Returns to XCom a dict with ``writer_id``, ``upper``,
    ``committed``, ``converged``, ``stopped_because`` and ``batches`` (per batch: ts,
    outcome, rows_in, rows_out, rejected, lag and lag_unit after it (the records or segment
    files pending), lag_offsets, seconds and timings).

    Runs only while the shard's stream is READY (docs/operator.md, "Stopped and recovering
    streams"): a run that finds it STOPPING, STOPPED or RECOVERING fails without retry
    (``stream refused: ...``, naming who set the status, when and why); a stop or a recovery
    begun during the run lets the batch in hand finish and starts no other
    (``stopped_because`` says why); a commit fenced by one fails without retry
    (``stream fenced by a stop: ...`` / ``by a recovery``), nothing of that batch committed.

    :param shard: the shard id (templated).
    :param upsert_conn_id: the `upsert` connection (consensus, blob, Spark connection).
    :param max_batches: batches to run at most (templated); ignored with ``until_caught_up``.
    :param until_caught_up: run until the source holds nothing unbound (templated).
    :param max_files_per_batch: source files per batch for bindings this task mints
        (templated); default the shard's. A backfill passes a large value.
    :param on_bad_record: ``fail`` (default) or ``quarantine`` (templated).
    :param continuous_for: (templated) run in continuous mode for this long: seconds, or a
        duration such as ``"10m"`` or ``"1h30m"``. Batches run back to back in one Spark
        session, an idle source is polled, and the next Kafka slice is fetched while a batch
        commits; a stop or a recovery ends the run between batches. Overrides
        ``max_batches`` and ``until_caught_up``. Default: off.
    :param kafka_conn_id: (templated) the Airflow connection of type ``kafka`` (its extra is
        the client config) of a Kafka shard; default the upsert connection's
        ``kafka_conn_id``. A Kafka shard without either fails without retry. Its secrets are
        masked in the task log and never reach XCom or the submit command line.
    :param spark_mode: (templated) ``in_process`` (Spark in the worker process, on the Spark
        connection's master, ``local[*]`` by default) or ``submit`` (the packaged job through
        the Spark provider's ``SparkSubmitHook`` on the Spark connection, client deploy mode) or
        ``connect`` (the engine in the worker, its Spark work on a Spark Connect server: the
        ``spark_connect`` connection ``spark_connect_conn_id``, else the upsert connection's
        Spark connection when it is of that type, else ``sc://127.0.0.1:15002``, the server
        ``upsertctl spark-server start`` runs). A server that does not answer fails the try
        with a retryable error naming its address.
    :param spark_connect_conn_id: (templated) the ``spark_connect`` connection of ``connect``
        mode (read through the Spark provider's ``SparkConnectHook``).
    :param spark_conf: Spark settings (templated), for any mode (in ``connect`` mode only
        settings a session may change; the server fixes the others).
    :param submit_options: extra keyword arguments for ``SparkSubmitHook`` in ``submit`` mode
        (e.g. ``executor_cores``, ``executor_memory``, ``total_executor_cores``). The driver
        runs in client deploy mode (``deploy_mode`` may only be ``client``); ``conf``,
        ``conn_id``, ``py_files``, ``application_args`` and ``env_vars`` are the operator's.
    """

    template_fields: Sequence[str] = (
        "shard",
        "max_batches",
        "until_caught_up",
        "max_files_per_batch",
        "on_bad_record",
        "spark_mode",
        "spark_conf",
        "continuous_for",
        "kafka_conn_id",
        "spark_connect_conn_id",
    )
    template_fields_renderers = {"spark_conf": "json"}
    ui_color = "#d9ecf2"
    operator_extra_links = (ShardPageLink(),)

    def __init__(
        self,
        *,
        shard: str,
        upsert_conn_id: str = DEFAULT_CONN_ID,
        max_batches: int | str | None = 1,
        until_caught_up: bool | str = False,
        max_files_per_batch: int | str | None = None,
        on_bad_record: str = "fail",
        spark_mode: str = "in_process",
        spark_conf: dict[str, str] | None = None,
        submit_options: dict[str, Any] | None = None,
        continuous_for: float | int | str | datetime.timedelta | None = None,
        kafka_conn_id: str | None = None,
        spark_connect_conn_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.shard = shard
        self.upsert_conn_id = upsert_conn_id
        self.max_batches = max_batches
        self.until_caught_up = until_caught_up
        self.max_files_per_batch = max_files_per_batch
        self.on_bad_record = on_bad_record
        self.spark_mode = spark_mode
        self.spark_conf = spark_conf or {}
        self.submit_options = submit_options or {}
        self.continuous_for = continuous_for
        self.kafka_conn_id = kafka_conn_id
        self.spark_connect_conn_id = spark_connect_conn_id
        if not is_templated(shard) and not is_templated(upsert_conn_id):
            # A literal shard is declared, so the DAG's graph and the asset views show it.
            asset = shard_asset(upsert_conn_id, shard)
            if all(getattr(o, "uri", None) != asset.uri for o in self.outlets):
                self.outlets = [*self.outlets, asset]
        self._spark = None
        self._submit_hook = None
        self._submit_env_vars: dict[str, str] = {}
        self._killed = False
        # The tag of this task's Spark Connect operations (connect mode).
        self._connect_tag = f"upsert-task-{uuid.uuid4().hex}"

    # -- execute -----------------------------------------------------------------------------

    def execute(self, context: Context) -> dict[str, Any]:
        started = time.monotonic()
        ti = context["ti"]
        writer_id = writer_id_for(ti.dag_id, ti.run_id, ti.task_id, ti.map_index, ti.try_number)
        until_caught_up = parse_bool(self.until_caught_up, "until_caught_up")
        max_batches = parse_int(self.max_batches, "max_batches")
        if not until_caught_up and max_batches is None:
            max_batches = 1
        max_files = parse_int(self.max_files_per_batch, "max_files_per_batch")
        on_bad_record = parse_choice(self.on_bad_record, "on_bad_record", BAD_RECORD_MODES)
        spark_mode = parse_choice(self.spark_mode, "spark_mode", SPARK_MODES)
        continuous_seconds = parse_duration(self.continuous_for, "continuous_for")
        kafka_conn_id = optional_text(self.kafka_conn_id)

        hook = UpsertShardHook(upsert_conn_id=self.upsert_conn_id)
        try:
            # Fail fast, before any Spark starts, on what a retry cannot fix: an unknown shard,
            # a stream that is not READY (a submitted job would only find the same refusal).
            # The writer checks the stream again when it starts, and fences every commit.
            shard = hook.open_shard(self.shard, kafka_conn_id=kafka_conn_id, require_kafka_config=True)
            stream = require_ready(shard.consensus, self.shard)
            upper_at_start = shard.state().upper
            self.log.info(
                "shard %s: upper %s; stream %s (epoch %s); writer %s; consensus %s; blob %s; spark %s",
                self.shard, upper_at_start, stream.status.value, stream.epoch, writer_id,
                hook.settings.redacted_consensus_url, hook.settings.blob_root, spark_mode,
            )
            if shard.is_kafka:
                # Names only: the client config's values stay out of the log.
                self.log.info("shard %s reads kafka topic %r as consumer group %r", self.shard,
                              shard.source.topic, shard.group_id)
            if continuous_seconds is not None:
                self.log.info("shard %s: continuous mode for %s", self.shard, format_seconds(continuous_seconds))
            plan = _RunPlan(writer_id, max_batches, until_caught_up, max_files, on_bad_record, continuous_seconds)
            if spark_mode == "submit":
                report = self._run_submit(hook, plan, shard, context)
            elif spark_mode == "connect":
                report = self._run_in_process(hook, shard, plan, remote=self._connect_address(hook))
            else:
                report = self._run_in_process(hook, shard, plan)
            # The table schema version at the upper (a batch may have added a column): the Asset
            # event and the lineage carry it (the commit-event contract).
            report["schema_version"] = shard.refresh_schema().schema_version
            # What the failed earlier tries of this task instance committed: they announced none of it.
            earlier_ids = earlier_try_writer_ids(writer_id)
            earlier = [committed_batch(b.ts, b.stats, b.committed_at) for b in shard.consensus.batches(
                self.shard, below=report["upper"], writer_ids=earlier_ids)] if earlier_ids else []
            self._lineage = capture(self, hook, report, shard=shard)
            send_metrics(lambda: [*(m for b in report.get("batches") or [] for m in batch_metrics(self.shard, b)),
                                  *live_runs_metrics(self.shard, len(shard.live_runs()))])
        except UpsertError as exc:
            if isinstance(exc, OutcomeUnknown):
                send_metrics(lambda: outcome_unknown_metrics(self.shard, time.monotonic() - started))
            raise_from(to_airflow_error(exc, hook), exc)
        finally:
            hook.close()
        report["task_seconds"] = round(time.monotonic() - started, 3)
        report.update(shard=self.shard, writer_id=writer_id, spark_mode=spark_mode)
        event = producer_event(upper_at_start, [committed_batch(int(b["ts"]), b, None) for b in report.get("batches") or []
                                                if b.get("outcome") in OWN_COMMIT_OUTCOMES], earlier)
        self._set_asset_event(context, report, due=event is not None, upper_at_start=upper_at_start, event=event)
        if report.get("stopped_because"):
            # A stop or a recovery began during the run: the batch in hand finished, no other started.
            self.log.warning("shard %s: run ended early, no further batch started: %s",
                             self.shard, report["stopped_because"])
        self.log.info(
            "shard %s: upper %s, %s committed, %s converged, %s step(s) in %s",
            self.shard, report["upper"], report["committed"], report["converged"],
            len(report["batches"]), format_seconds(report["task_seconds"]),
        )
        return report

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """OpenLineage: the source read, the shard written, its frontier (docs/lineage.md)."""
        return operator_lineage(getattr(self, "_lineage", None))

    def _set_asset_event(
        self, context: Context, report: dict[str, Any], *, due: bool, upper_at_start: int,
        event: ProducerEvent | None = None,
    ) -> None:
        """The shard's Asset event, when ``due``, with ``event``'s range and numbers
        (:func:`producer_event`); none otherwise.

        Airflow registers an event for every Asset in the task's outlets when the task
        succeeds (the task runner sends ``ti.task.outlets`` as they are then); there is no
        supported way to succeed with an outlet and skip its event. So the rendered shard's
        asset is in this try's outlets exactly when the event is due: added for a templated
        shard (an event is registered once some DAG declares the asset, e.g. a DAG scheduled
        on it), removed for a literal one otherwise.
        """
        asset = shard_asset(self.upsert_conn_id, self.shard)
        # A shard asset of this connection declared for a templated shard (the example DAGs
        # declare their default shard's, so the Assets view shows the producing task) stands
        # for the rendered shard: an event goes to the rendered shard's asset, never another's.
        prefix = f"{ASSET_SCHEME}://{self.upsert_conn_id}/"
        others = [o for o in self.outlets if not str(getattr(o, "uri", "")).startswith(prefix)]
        if not due:
            self.outlets = others
            self.log.info("shard %s: this run committed no batch, no event for asset %s", self.shard, asset.uri)
            return
        self.outlets = [*others, asset]
        events = context.get("outlet_events")
        if events is None:
            # Called outside a task runner (execute() from a script or a unit test): no event
            # is registered there, so there is no extra to set.
            return
        event = event or ProducerEvent(upper_at_start, 0, 0)
        events[asset].extra = {
            "upper": report.get("upper"),
            "upper_before": upper_at_start,
            "committed": report.get("committed"),
            "rows_in": event.rows_in,
            # The commit-event contract, as ShardCommitTrigger's events carry it (docs/events.md).
            **commit_range(event.from_ts, report.get("upper"), event.rows_out, report.get("schema_version")),
        }

    def _log_batch(self, batch: dict[str, Any]) -> None:
        self.log.info("%s", batch_line(batch))

    def _connect_address(self, hook: UpsertShardHook) -> str:
        """The Spark Connect address of ``connect`` mode, from the Spark provider's
        ``SparkConnectHook`` (its token, if any, is masked by Airflow as a password)."""
        from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook
        from airflow.sdk.exceptions import AirflowNotFoundException

        from airflow_upsert_provider.engine.spark.server import display_remote

        named = optional_text(self.spark_connect_conn_id)
        conn_id = named or hook.settings.spark_conn_id
        try:
            conn = hook.get_connection(conn_id)
        except AirflowNotFoundException:
            if named:
                raise ConfigurationError(f"the spark_connect connection {named!r} is not defined",
                                         field="spark_connect_conn_id") from None
            conn = None
        if conn is None or (not named and conn.conn_type != SparkConnectHook.conn_type):
            self.log.info("connect mode: no spark_connect connection (%s is %s); using %s", conn_id,
                          "not defined" if conn is None else f"of type {conn.conn_type!r}", DEFAULT_CONNECT_ADDRESS)
            return DEFAULT_CONNECT_ADDRESS
        if conn.conn_type != SparkConnectHook.conn_type:
            raise ConfigurationError(
                f"connection {conn_id!r} is of type {conn.conn_type!r}; connect mode needs a 'spark_connect' one",
                field="spark_connect_conn_id",
            )
        try:
            address = SparkConnectHook(conn_id=conn_id).get_connection_url()
        except ValueError as exc:
            raise ConfigurationError(f"connection {conn_id!r}: {exc}", field="spark_connect_conn_id") from None
        self.log.info("connect mode: Spark Connect server %s (connection %s)", display_remote(address), conn_id)
        return address

    def _run_in_process(
        self, hook: UpsertShardHook, shard: Shard, plan: _RunPlan, remote: str | None = None
    ) -> dict[str, Any]:
        """The writer in this process; its Spark in this process too, or on the Spark Connect
        server at ``remote`` (connect mode)."""
        from airflow_upsert_provider.engine.write.writer import Writer

        spark_seconds: list[float] = []

        def spark_factory():
            # A writer that only skips persisted batches never starts Spark.
            if self._killed:
                raise AirflowException("the task is being stopped: no Spark session is started")
            if self._spark is None:
                from pyspark.sql import SparkSession

                spark_started = time.monotonic()
                owned = SparkSession.getActiveSession() is None
                if remote is not None:
                    from airflow_upsert_provider.engine.spark.session import get_spark

                    # A Kafka client config with secrets never goes into a shared session.
                    session = get_spark(remote=remote, conf=self.spark_conf,
                                        private=shard.is_kafka and shard.source.carries_secrets)
                else:
                    session = hook.get_spark(app_name=f"upsert-{self.shard}", conf=self.spark_conf)
                spark_seconds.append(time.monotonic() - spark_started)
                self._spark = (session, owned)
            if remote is not None:
                # Tags belong to a thread: every thread that runs this task's Spark work (the
                # writer's, continuous mode's prefetch) tags its operations for on_kill, which
                # must not interrupt other tasks sharing the server session.
                self._spark[0].addTag(self._connect_tag)
            return self._spark[0]

        writer = Writer(
            shard, plan.writer_id, spark_factory=spark_factory,
            on_bad_record=plan.on_bad_record, max_files_per_batch=plan.max_files_per_batch,
        )
        try:
            if plan.continuous_seconds is not None:
                from airflow_upsert_provider.engine.write.continuous import run_continuous

                run = run_continuous(writer, duration_seconds=plan.continuous_seconds,
                                     on_result=lambda result: self._log_batch(result.to_dict()))
            else:
                run = writer.run(
                    max_batches=None if plan.until_caught_up else plan.max_batches,
                    until_caught_up=plan.until_caught_up,
                    on_result=lambda result: self._log_batch(result.to_dict()),
                )
        finally:
            self._stop_spark()
        return {**run.to_dict(), "spark_start_seconds": round(sum(spark_seconds), 3)}

    def _stop_spark(self) -> None:
        if self._spark is not None:
            session, owned = self._spark
            self._spark = None
            if owned:
                session.stop()

    def _run_submit(self, hook: UpsertShardHook, plan: _RunPlan, shard: Shard | None = None,
                    context: Context | None = None) -> dict[str, Any]:
        from airflow_upsert_provider.engine.write import spark_job

        # Settle the blob root here: a missing root is a configuration error, not a job failure.
        blob = hook.get_blob()
        # Private to the worker's user (mkdtemp: mode 0700); removed with everything in it.
        workdir = tempfile.mkdtemp(prefix="upsert-submit-")
        try:
            result_file = os.path.join(workdir, "result.json")
            self._submit_hook = self._build_submit_hook(hook, plan, blob.root, workdir, result_file, shard, context)
            submit_started = time.monotonic()
            failure: AirflowException | None = None
            try:
                # spark-submit (and the driver beside this task) get the aws connection's
                # credentials in their own environment; this process's stays as it is.
                self._submit_hook.submit(application=os.path.abspath(spark_job.__file__),
                                         env=hook.child_environment(self._submit_env_vars))
            except AirflowException as exc:
                failure = exc
            submit_seconds = time.monotonic() - submit_started
            if not os.path.exists(result_file):
                raise AirflowException(
                    f"the Spark job ended without a result ({failure or 'no error reported'})"
                )
            with open(result_file, encoding="utf-8") as handle:
                result = json.load(handle)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        if not result.get("ok"):
            raise error_from_result(result)
        for batch in result["batches"]:
            self._log_batch(batch)
        result.pop("ok", None)
        result["submit_seconds"] = round(submit_seconds, 3)
        return result

    def _build_submit_hook(
        self, hook: UpsertShardHook, plan: _RunPlan, blob_root: str, workdir: str, result_file: str,
        shard: Shard | None = None, context: Context | None = None,
    ) -> SparkSubmitHook:
        """The SparkSubmitHook of one submit-mode run, its files in ``workdir``.

        The consensus URL (it may hold the password) goes in a file readable only by this
        user, whose path is the job's argument: neither the command line (logged, and visible
        to every user in ``ps``) nor ``env_vars``, which the Spark provider turns into
        ``--conf spark.yarn.appMasterEnv.*`` / ``spark.kubernetes.driverEnv.*`` arguments on
        YARN and Kubernetes masters. The driver runs in client deploy mode, beside this task,
        so it reads the file where it was written. A Kafka shard's client config (it may hold
        ``sasl.password``) travels the same way, in a second private file.
        """
        from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

        options = {"name": f"upsert-{self.shard}", **self.submit_options}
        deploy_mode = options.pop("deploy_mode", None) or "client"
        if deploy_mode != "client":
            raise AirflowFailException(
                f"submit_options deploy_mode must be 'client', got {deploy_mode!r}: the driver runs "
                "beside the task, where it reads the consensus credentials file"
            )
        for reserved in ("conf", "conn_id", "py_files", "application_args", "env_vars"):
            if reserved in options:
                raise AirflowFailException(
                    f"submit_options cannot set {reserved!r}: the operator sets it (use spark_conf for Spark settings)"
                )
        url_file = write_private_file(workdir, "consensus-url", hook.settings.consensus_url)
        args = [
            "--shard", self.shard, "--writer-id", plan.writer_id, "--blob-root", blob_root,
            "--result-file", result_file, "--on-bad-record", plan.on_bad_record,
            "--consensus-url-file", url_file,
        ]
        if shard is not None and shard.is_kafka:
            config_file = write_private_file(workdir, "kafka-config.json", json.dumps(dict(shard.source.config.properties)))
            args += ["--kafka-config-file", config_file]
        if plan.continuous_seconds is not None:
            args += ["--continuous-for", repr(plan.continuous_seconds)]
        else:
            args += ["--until-caught-up"] if plan.until_caught_up else ["--max-batches", str(plan.max_batches)]
        if plan.max_files_per_batch:
            args += ["--max-files-per-batch", str(plan.max_files_per_batch)]
        conf = {"spark.pyspark.python": sys.executable, "spark.pyspark.driver.python": sys.executable}
        conf.update(self.spark_conf)
        if context is not None:
            # OpenLineage: the job names this task as its parent, as SparkSubmitOperator's does.
            conf = parent_job_spark_conf(conf, context)
        # spark-submit's own environment gets the same variables (_run_submit).
        self._submit_env_vars = submit_env_vars(submit_master(hook))
        return _submit_hook_class()(
            conf=conf,
            conn_id=hook.settings.spark_conn_id,
            py_files=package_zip(workdir),
            application_args=args,
            env_vars=self._submit_env_vars,
            deploy_mode=deploy_mode,
            **options,
        )

    def on_kill(self) -> None:
        """Stop the Spark work this task started: the spark-submit process (and its driver),
        or the in-process SparkContext (its running job fails, no later one starts)."""
        self._killed = True
        if self._submit_hook is not None:
            self.log.info("on_kill: stopping spark-submit")
            self._submit_hook.on_kill()
        if self._spark is not None:
            import threading

            from airflow_upsert_provider.engine.spark.session import is_connect_session

            if is_connect_session(self._spark[0]):
                self._interrupt_connect(self._spark[0])
                return
            context = self._spark[0].sparkContext
            self.log.info("on_kill: stopping the Spark jobs of this task")

            def stop() -> None:
                context.cancelAllJobs()
                # Cancelling alone misses a job submitted a moment later (a write's job
                # follows its shuffle's); a stopped context runs none.
                context.stop()

            # Called from a signal handler while the task thread may be inside a Py4J call:
            # stop through another thread, which gets its own gateway connection.
            stopper = threading.Thread(target=stop, name="upsert-on-kill", daemon=True)
            stopper.start()
            stopper.join(timeout=60)


    def _interrupt_connect(self, session: Any) -> None:
        """connect mode: interrupt this task's Connect operations (by their tag: the server
        session may be shared with other tasks, which run on), then close this client so that
        no later operation starts."""
        import threading

        self.log.info("on_kill: interrupting the Spark Connect operations of this task")

        def stop() -> None:
            try:
                session.interruptTag(self._connect_tag)
            finally:
                session.stop()

        stopper = threading.Thread(target=stop, name="upsert-on-kill", daemon=True)
        stopper.start()
        stopper.join(timeout=60)
