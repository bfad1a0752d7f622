"""Offset-addressed sources: partitioned, append-only logs of change records (directory, Kafka):
planning (pure) and reading.

May import: engine.errors, spark."""

from __future__ import annotations

from typing import TYPE_CHECKING, Union

from airflow_upsert_provider.engine.errors import ConfigurationError
from airflow_upsert_provider.engine.sources.directory import DirectorySource, Segment

if TYPE_CHECKING:
    from airflow_upsert_provider.engine.sources.kafka import KafkaConfig, KafkaSource

    Source = Union[DirectorySource, KafkaSource]

KAFKA_SCHEME = "kafka"


def is_kafka_uri(uri: str) -> bool:
    return uri.partition(":")[0] == KAFKA_SCHEME


def open_source(uri: str, source_format: str, *, kafka_config: "KafkaConfig | None" = None) -> "Source":
    """``dir:/path`` (a landing directory of segment files) or ``kafka:TOPIC`` (a topic;
    reading it needs ``kafka_config``, the client config, given at run time)."""
    scheme, _, rest = uri.partition(":")
    if scheme == "dir" and rest:
        return DirectorySource(rest, source_format)
    if scheme == KAFKA_SCHEME and rest.strip():
        from airflow_upsert_provider.engine.sources.kafka import KafkaSource

        return KafkaSource(rest, kafka_config)
    raise ConfigurationError(
        f"unsupported source {uri!r}: expected dir:/path/to/landing or kafka:TOPIC", field="source"
    )


__all__ = ["DirectorySource", "Segment", "is_kafka_uri", "open_source"]
