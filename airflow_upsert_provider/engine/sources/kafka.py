"""KafkaSource: a topic's partitions, their watermarks, and a bound slice read by Spark executors.

A Kafka partition is addressed by offsets the broker assigns: the *low watermark* is the
first offset still held (retention deletes below it), the *high watermark* the offset the
next message will get. A bound slice is ``{partition: (from, to)}``, the half-open ranges
``[from, to)`` a batch reads; ``read_slice`` reads them on the executors through a Python
data source, one Spark input partition per Kafka partition range, and yields exactly the
messages at those offsets.

The client configuration (:class:`KafkaConfig`) is the Kafka provider connection's extra:
librdkafka properties, ``bootstrap.servers`` required. Secrets in it never reach a repr, an
error message or a Spark plan: the data source receives the configuration as an attribute of
the data source class it is registered with, never as a reader option, since options are
part of what Spark records about a query.
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator, Mapping

from airflow_upsert_provider.engine.errors import (
    ConfigurationError,
    KafkaSliceUnavailable,
    KafkaUnavailable,
    UpsertError,
)
from airflow_upsert_provider.engine.sources.lag import RECORDS
from airflow_upsert_provider.engine.spark.executor_errors import ExecutorError

if TYPE_CHECKING:
    import pyarrow
    from confluent_kafka import Consumer
    from pyspark.sql import DataFrame, SparkSession

REQUIRED_FIELD = "bootstrap.servers"
# A property is secret when its name says so. Over-masking a path (``ssl.key.location``) costs
# nothing; leaking a password costs everything.
SECRET_NAME = re.compile(r"password|secret|key|token|jaas|credential", re.IGNORECASE)
MASK = "***"
# The reader never commits and never joins the group: a slice is read by position, and the
# shard's compare-and-append is the only commit there is.
READER_OVERRIDES = {
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    # An offset outside what the broker holds is an error, never a silent jump to the end.
    "auto.offset.reset": "error",
    # Only committed transactions: the high watermark the broker reports is then the last
    # stable offset, so a binding never names the messages of an open transaction, and the
    # reader skips those of aborted ones. read_uncommitted would put records a producer
    # rolled back into the table.
    "isolation.level": "read_committed",
}
DEFAULT_GROUP = "upsert-reader"
# Columns of a slice, in order; value is the message value decoded as UTF-8 (None for a
# tombstone), timestamp the message's timestamp (producer or broker time, UTC).
SLICE_SCHEMA = "partition INT, offset BIGINT, key STRING, value STRING, timestamp TIMESTAMP, problem STRING"
# Messages asked of one consume() call at most, so that an executor yields Arrow batches of a
# bounded size instead of holding a whole partition range.
MAX_BATCH = 10_000


@dataclass(frozen=True)
class KafkaConfig:
    """librdkafka client properties, as a ``kafka`` connection's extra holds them.

    Values are kept as given (strings, numbers, booleans); ``redacted()`` is the only form
    fit for logs, errors and XCom.
    """

    properties: Mapping[str, Any] = field(repr=False)

    @classmethod
    def from_dict(cls, raw: Any) -> "KafkaConfig":
        if not isinstance(raw, Mapping):
            raise ConfigurationError(
                f"kafka client config must be a JSON object of librdkafka properties, not {type(raw).__name__}",
                field="kafka_config",
            )
        properties: dict[str, Any] = {}
        for name, value in raw.items():
            if not isinstance(name, str) or not name:
                raise ConfigurationError(f"kafka client config: property name {name!r} is not a non-empty string", field="kafka_config")
            if not isinstance(value, (str, int, float, bool)):
                shown = MASK if SECRET_NAME.search(name) else repr(value)
                raise ConfigurationError(
                    f"kafka client config: property {name!r} must be a string, number or boolean, not {type(value).__name__} ({shown})",
                    field=name,
                )
            properties[name] = value
        servers = properties.get(REQUIRED_FIELD)
        if not isinstance(servers, str) or not servers.strip():
            raise ConfigurationError(
                f"kafka client config: {REQUIRED_FIELD!r} is required: the brokers to start from, host:port[,host:port...]",
                field=REQUIRED_FIELD,
            )
        return cls(properties)

    @property
    def bootstrap_servers(self) -> str:
        return str(self.properties[REQUIRED_FIELD])

    @property
    def group_id(self) -> str | None:
        group = self.properties.get("group.id")
        return None if group is None else str(group)

    def secret_values(self) -> list[str]:
        return [str(v) for k, v in self.properties.items() if SECRET_NAME.search(k) and str(v)]

    def redacted(self) -> dict[str, Any]:
        """The properties with every secret's value replaced by ``***``."""
        return {k: (MASK if SECRET_NAME.search(k) else v) for k, v in self.properties.items()}

    def scrub(self, text: str) -> str:
        """``text`` with every secret value of this config masked: for messages that come
        from the client library, which may quote a property's value."""
        for secret in sorted(self.secret_values(), key=len, reverse=True):
            text = text.replace(secret, MASK)
        return text

    def consumer_properties(self) -> dict[str, Any]:
        """What a reading consumer is created with: the config, a group id when it names
        none (librdkafka wants one even for assign-only use), never auto-commit, and the
        client's own log lines routed through :class:`ClientLog` (scrubbed)."""
        properties = dict(self.properties)
        properties.setdefault("group.id", DEFAULT_GROUP)
        properties.update(READER_OVERRIDES)
        properties["logger"] = ClientLog(self)
        return properties

    def __repr__(self) -> str:
        return f"KafkaConfig({self.redacted()!r})"

    __str__ = __repr__


class ClientLog:
    """Where librdkafka's log lines go: Python logging, with this config's secret values
    masked. Left to itself the client prints to stderr, and some of its warnings quote
    property values (``Configuration property `x` (value) should be ...``)."""

    logger = logging.getLogger("airflow_upsert_provider.kafka.client")

    def __init__(self, config: KafkaConfig) -> None:
        self._config = config

    def log(self, level: int, message: str, *args: Any) -> None:
        text = message % args if args else message
        self.logger.log(level, "%s", self._config.scrub(text))


def open_consumer(config: KafkaConfig) -> "Consumer":
    from confluent_kafka import Consumer, KafkaException

    try:
        return Consumer(config.consumer_properties())
    except (KafkaException, ValueError, TypeError) as exc:
        # librdkafka quotes an invalid value in its message: scrub it before it travels.
        raise ConfigurationError(f"kafka client config refused: {config.scrub(str(exc))}", field="kafka_config") from None


def check_ranges(ranges: Mapping[int, tuple[int, int]]) -> dict[int, tuple[int, int]]:
    """``{partition: (from, to)}`` with non-negative integers and from <= to, sorted."""
    if not isinstance(ranges, Mapping):
        raise ConfigurationError("kafka slice ranges must be a mapping {partition: (from, to)}", field="ranges")
    checked: dict[int, tuple[int, int]] = {}
    for partition, bounds in ranges.items():
        if isinstance(partition, bool) or not isinstance(partition, int) or partition < 0:
            raise ConfigurationError(f"kafka slice: partition {partition!r} is not a non-negative integer", field="ranges")
        try:
            start, end = bounds
        except (TypeError, ValueError):
            raise ConfigurationError(f"kafka slice: partition {partition} range {bounds!r} is not (from, to)", field="ranges") from None
        for bound in (start, end):
            if isinstance(bound, bool) or not isinstance(bound, int) or bound < 0:
                raise ConfigurationError(f"kafka slice: partition {partition} offset {bound!r} is not a non-negative integer", field="ranges")
        if start > end:
            raise ConfigurationError(f"kafka slice: partition {partition} range [{start}, {end}) ends before it starts", field="ranges")
        checked[partition] = (start, end)
    return dict(sorted(checked.items()))


def read_range(
    config: KafkaConfig,
    topic: str,
    partition: int,
    start: int,
    end: int,
    *,
    stall_timeout: float = 30.0,
    poll_timeout: float = 1.0,
    max_batch: int = MAX_BATCH,
) -> Iterator["pyarrow.RecordBatch"]:
    """The messages of ``topic``/``partition`` at offsets ``[start, end)``, as Arrow batches
    with the columns of :data:`SLICE_SCHEMA`. Runs where it is called: on a Spark executor
    for a slice, or anywhere for a look at a range.

    Asks each ``consume()`` for no more than the range still holds, so that the call returns
    as soon as the range is complete instead of waiting out its timeout. Offsets may have
    gaps (compaction, transaction markers): the range is complete when the consumer's
    position reaches ``end``. Fails, naming topic, partition and offset, when no progress is
    made for ``stall_timeout`` seconds or the broker reports the offset out of range.
    """
    import pyarrow as pa
    from confluent_kafka import KafkaError, TopicPartition

    if start >= end:
        return
    consumer = open_consumer(config)
    try:
        consumer.assign([TopicPartition(topic, partition, start)])
        next_offset = start
        last_progress = time.monotonic()
        while next_offset < end:
            messages = consumer.consume(min(end - next_offset, max_batch), poll_timeout)
            columns: dict[str, list[Any]] = {
                "partition": [], "offset": [], "key": [], "value": [], "timestamp": [], "problem": []}
            for message in messages:
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise _read_error(config, topic, partition, next_offset, end, error.str(),
                                      error.retriable() or _unreachable(error.code()))
                offset = message.offset()
                if offset >= end:
                    # Messages come in offset order: the rest of the range holds none (its
                    # offsets are transaction markers, aborted or compacted messages).
                    next_offset = end
                    break
                if offset < next_offset:
                    # Only the assigned partition is read; an offset before the position
                    # would mean the position moved under us: never pass it on.
                    raise KafkaSliceUnavailable(
                        f"kafka topic {topic!r} partition {partition}: got offset {offset} while reading [{next_offset}, {end})",
                        topic=topic, partition=partition, offset=offset,
                    )
                columns["partition"].append(partition)
                columns["offset"].append(offset)
                key, key_problem = _decode(message.key(), "key")
                value, value_problem = _decode(message.value(), "value")
                columns["key"].append(key)
                columns["value"].append(value)
                columns["problem"].append(key_problem or value_problem)
                ts_type, ts_ms = message.timestamp()
                columns["timestamp"].append(ts_ms * 1000 if ts_type != 0 and ts_ms >= 0 else None)
                next_offset = offset + 1
            if columns["offset"]:
                last_progress = time.monotonic()
                yield pa.RecordBatch.from_arrays(
                    [
                        pa.array(columns["partition"], pa.int32()),
                        pa.array(columns["offset"], pa.int64()),
                        pa.array(columns["key"], pa.string()),
                        pa.array(columns["value"], pa.string()),
                        pa.array(columns["timestamp"], pa.timestamp("us", tz="UTC")),
                        pa.array(columns["problem"], pa.string()),
                    ],
                    names=list(columns),
                )
                continue
            if next_offset >= end:
                return
            # Nothing arrived: the rest of the range may be offsets without messages.
            position = consumer.position([TopicPartition(topic, partition)])[0].offset
            if position >= end:
                return
            if position > next_offset:
                next_offset = position
                last_progress = time.monotonic()
            elif time.monotonic() - last_progress > stall_timeout:
                raise _stalled(consumer, config, topic, partition, next_offset, end, stall_timeout)
    finally:
        consumer.close()


def _stalled(consumer: "Consumer", config: KafkaConfig, topic: str, partition: int, offset: int, end: int,
             stall_timeout: float) -> UpsertError:
    """Why no message came for ``stall_timeout`` seconds, from what the partition holds now.

    A range past the partition's high watermark (the topic was truncated or recreated since
    the driver checked the slice) cannot be read by waiting: an integrity error. Otherwise the
    messages exist and the broker is slow or unreachable: retryable, like any broker outage."""
    from confluent_kafka import KafkaException, TopicPartition

    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=stall_timeout, cached=False)
    except KafkaException as exc:
        return KafkaUnavailable(
            f"kafka topic {topic!r} partition {partition}: no message at offset {offset} within {stall_timeout:g}s "
            f"while reading up to offset {end} (exclusive), and the partition's watermarks could not be read: "
            f"{config.scrub(str(exc))}; the broker is slow or unreachable",
            topic=topic, partition=partition, offset=offset, end=end,
        )
    if end > high or offset < low:
        return KafkaSliceUnavailable(
            f"kafka topic {topic!r} partition {partition}: no message at offset {offset} within {stall_timeout:g}s "
            f"while reading up to offset {end} (exclusive): the range reaches past what the partition holds "
            f"(offsets {low}..{high - 1})",
            topic=topic, partition=partition, offset=offset, end=end,
        )
    return KafkaUnavailable(
        f"kafka topic {topic!r} partition {partition}: no message at offset {offset} within {stall_timeout:g}s "
        f"while reading up to offset {end} (exclusive), though the partition holds offsets {low}..{high - 1}: "
        "the broker is slow or unreachable",
        topic=topic, partition=partition, offset=offset, end=end,
    )


# Errors of a cluster that does not answer: retryable, whatever librdkafka's retriable flag says.
UNREACHABLE_ERRORS = ("_TRANSPORT", "_ALL_BROKERS_DOWN", "_TIMED_OUT", "_RESOLVE", "NOT_LEADER_FOR_PARTITION",
                      "LEADER_NOT_AVAILABLE", "REQUEST_TIMED_OUT", "NETWORK_EXCEPTION", "BROKER_NOT_AVAILABLE")


def _unreachable(code: int) -> bool:
    from confluent_kafka import KafkaError

    return any(code == getattr(KafkaError, name, None) for name in UNREACHABLE_ERRORS)


def _read_error(config: KafkaConfig, topic: str, partition: int, offset: int, end: int, reason: str, retriable: bool) -> UpsertError:
    message = f"kafka topic {topic!r} partition {partition}: reading offset {offset} (range end {end}) failed: {config.scrub(reason)}"
    if retriable:
        return KafkaUnavailable(message, topic=topic, partition=partition, offset=offset)
    return KafkaSliceUnavailable(message, topic=topic, partition=partition, offset=offset)


def _decode(raw: bytes | None, what: str) -> tuple[str | None, str | None]:
    """(text, None), or (None, why) for bytes that are not UTF-8: a bad message is a bad
    record (failed or quarantined by the batch's rule), never a failed read."""
    if raw is None:
        return None, None
    try:
        return raw.decode("utf-8"), None
    except UnicodeDecodeError as exc:
        return None, f"message {what} is not valid UTF-8 ({exc.reason} at byte {exc.start})"


def _slice_data_source(config: KafkaConfig, topic: str, stall_timeout: float) -> type:
    """A data source class carrying the client config as a class attribute.

    Built per read: Spark pickles a registered class by value (it is not importable by name),
    config included, and ships it to the Python workers, while reader options — the ranges
    here — are part of the query Spark describes in plans and events."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    class KafkaSliceReader(DataSourceReader):
        def __init__(self, ranges: list[list[int]]) -> None:
            self.ranges = ranges

        def partitions(self) -> list[InputPartition]:
            # value is (kafka partition, from, to): all a task needs besides the class's config.
            return [InputPartition((p, s, e)) for p, s, e in self.ranges]

        def read(self, partition: InputPartition) -> Iterator["pyarrow.RecordBatch"]:
            if partition.value is None:
                return  # Spark reads one placeholder partition when a slice has no ranges
            kafka_partition, start, end = partition.value
            try:
                yield from read_range(
                    KafkaSliceSource.client_config, KafkaSliceSource.topic, kafka_partition, start, end,
                    stall_timeout=KafkaSliceSource.stall_timeout,
                )
            except UpsertError as exc:
                raise ExecutorError(exc) from None

    class KafkaSliceSource(DataSource):
        client_config = config
        source_name = f"upsert_kafka_slice_{uuid.uuid4().hex}"

        @classmethod
        def name(cls) -> str:
            return cls.source_name

        def schema(self) -> str:
            return SLICE_SCHEMA

        def reader(self, schema: Any) -> DataSourceReader:
            return KafkaSliceReader(json.loads(self.options["ranges"]))

    KafkaSliceSource.topic = topic
    KafkaSliceSource.stall_timeout = stall_timeout
    return KafkaSliceSource


class KafkaSource:
    """One topic of a Kafka cluster. Partitions are the topic's partition numbers; offsets
    are Kafka offsets. Metadata calls run on the driver with one consumer, closed by
    ``close()`` (or the ``with`` block); slices are read on the executors."""

    lag_unit = RECORDS  # an offset is a record

    def __init__(self, topic: str, config: KafkaConfig | None, *, timeout: float = 10.0, stall_timeout: float = 30.0) -> None:
        if not isinstance(topic, str) or not topic.strip():
            raise ConfigurationError("kafka source: topic must be a non-empty string", field="topic")
        if config is not None and not isinstance(config, KafkaConfig):
            raise ConfigurationError(f"kafka source: config must be a KafkaConfig, not {type(config).__name__}", field="kafka_config")
        self.topic = topic
        # None: the shard was opened without a client config (enough for what reads consensus
        # only); the first use of the broker says how to give one.
        self._config = config
        self.timeout = timeout
        self.stall_timeout = stall_timeout
        self._consumer: Consumer | None = None

    @property
    def config(self) -> KafkaConfig:
        if self._config is None:
            raise ConfigurationError(
                f"kafka topic {self.topic!r}: no client config was given: pass --kafka-config FILE (a JSON "
                "object of librdkafka properties, bootstrap.servers required) to upsertctl, or kafka_conn_id "
                "(an Airflow 'kafka' connection) to the operator or in the upsert connection's extra",
                field="kafka_config",
            )
        return self._config

    @property
    def carries_secrets(self) -> bool:
        """Whether the client config has secret values (a Spark session that reads this
        source then holds them: it must be the task's own)."""
        return self._config is not None and bool(self._config.secret_values())

    @property
    def uri(self) -> str:
        return f"kafka:{self.topic}"

    def __repr__(self) -> str:
        return f"KafkaSource({self.topic!r}, {self._config!r})"

    def check(self) -> None:
        """The topic exists and lists partitions (as a directory source checks its root)."""
        self.partitions()

    def __enter__(self) -> "KafkaSource":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def consumer(self) -> "Consumer":
        if self._consumer is None:
            self._consumer = open_consumer(self.config)
        return self._consumer

    def partitions(self) -> list[int]:
        from confluent_kafka import KafkaException

        try:
            metadata = self.consumer().list_topics(self.topic, timeout=self.timeout)
        except KafkaException as exc:
            raise KafkaUnavailable(
                f"kafka topic {self.topic!r}: listing partitions failed: {self.config.scrub(str(exc))}", topic=self.topic
            ) from None
        topic = metadata.topics.get(self.topic)
        if topic is None or topic.error is not None or not topic.partitions:
            reason = topic.error.str() if topic is not None and topic.error is not None else "no partitions"
            raise ConfigurationError(
                f"kafka topic {self.topic!r} cannot be read from {self.config.bootstrap_servers}: {self.config.scrub(reason)}",
                field="topic",
            )
        return sorted(topic.partitions)

    def watermarks(self) -> dict[int, tuple[int, int]]:
        """``{partition: (low, high)}`` for every partition of the topic."""
        from confluent_kafka import KafkaException, TopicPartition

        marks: dict[int, tuple[int, int]] = {}
        for partition in self.partitions():
            try:
                low, high = self.consumer().get_watermark_offsets(TopicPartition(self.topic, partition), timeout=self.timeout)
            except KafkaException as exc:
                raise KafkaUnavailable(
                    f"kafka topic {self.topic!r} partition {partition}: reading watermarks failed: {self.config.scrub(str(exc))}",
                    topic=self.topic, partition=partition,
                ) from None
            marks[partition] = (low, high)
        return marks

    def high_watermarks(self) -> dict[int, int]:
        """``{partition: offset the next message will get}``."""
        return {p: high for p, (_, high) in self.watermarks().items()}

    def low_watermarks(self) -> dict[int, int]:
        """``{partition: first offset still held}``."""
        return {p: low for p, (low, _) in self.watermarks().items()}

    def first_message_times(self, positions: Mapping[int, int]) -> dict[int, float | None]:
        """The timestamp (unix seconds) of the message at each ``{partition: offset}``: the
        age of the oldest record not yet committed. None where no message is there (yet)."""
        from confluent_kafka import TopicPartition

        times: dict[int, float | None] = {p: None for p in positions}
        if not positions:
            return times
        consumer = open_consumer(self.config)
        try:
            consumer.assign([TopicPartition(self.topic, p, o) for p, o in positions.items()])
            deadline = time.monotonic() + self.timeout
            while any(v is None for v in times.values()) and time.monotonic() < deadline:
                waiting = [p for p, v in times.items() if v is None]
                messages = consumer.consume(len(waiting), min(1.0, self.timeout))
                if not messages:
                    break
                for message in messages:
                    partition = message.partition()
                    if message.error() is not None or partition not in times or times[partition] is not None:
                        continue
                    ts_type, ts_ms = message.timestamp()
                    times[partition] = ts_ms / 1000.0 if ts_type != 0 and ts_ms >= 0 else None
                    # One message per partition is all a look needs.
                    consumer.pause([TopicPartition(self.topic, partition)])
        finally:
            consumer.close()
        return times

    def check_slice(self, ranges: Mapping[int, tuple[int, int]]) -> dict[int, tuple[int, int]]:
        """The ranges, checked against the topic: every partition exists and every non-empty
        range lies within ``[low, high)``. Raises :class:`KafkaSliceUnavailable` naming
        topic, partition and offset otherwise."""
        checked = check_ranges(ranges)
        marks = self.watermarks()
        for partition, (start, end) in checked.items():
            if partition not in marks:
                raise ConfigurationError(
                    f"kafka topic {self.topic!r} has no partition {partition} (partitions: {sorted(marks)})", field="ranges"
                )
            if start == end:
                continue
            low, high = marks[partition]
            if end > high:
                raise KafkaSliceUnavailable(
                    f"kafka topic {self.topic!r} partition {partition}: range [{start}, {end}) reaches past the high "
                    f"watermark {high}: offset {max(start, high)} has no message yet",
                    topic=self.topic, partition=partition, offset=max(start, high), high_watermark=high,
                )
            if start < low:
                raise KafkaSliceUnavailable(
                    f"kafka topic {self.topic!r} partition {partition}: range [{start}, {end}) starts below the low "
                    f"watermark {low}: offsets {start}..{low - 1} were deleted by retention before they were read",
                    topic=self.topic, partition=partition, offset=start, low_watermark=low,
                )
        return checked

    def read_slice(self, spark: "SparkSession", ranges: Mapping[int, tuple[int, int]]) -> "DataFrame":
        """The messages at ``[from, to)`` of each partition, one Spark input partition per
        non-empty range, columns of :data:`SLICE_SCHEMA`. Lazy like any DataFrame: the
        executors read when it is evaluated; the ranges are checked against the watermarks
        now."""
        checked = self.check_slice(ranges)
        source = _slice_data_source(self.config, self.topic, self.stall_timeout)
        # PySpark has no way to unregister a data source: the class, config included, stays
        # in the session until the session ends. Never in one other tasks share.
        from airflow_upsert_provider.engine.spark.session import is_shared_session

        if self.carries_secrets and is_shared_session(spark):
            raise ConfigurationError(
                f"kafka topic {self.topic!r}: its client config has secrets, and the Spark Connect session "
                "is shared with other tasks: open a session of its own (get_spark(..., private=True))",
                field="kafka_config",
            )
        spark.dataSource.register(source)
        non_empty = [[p, s, e] for p, (s, e) in checked.items() if s < e]
        return spark.read.format(source.name()).option("ranges", json.dumps(non_empty)).load()
