"""Offset-addressed sources: partitioned, append-only logs of change records."""

from __future__ import annotations

from airflow_upsert_provider.engine.errors import ConfigurationError
from airflow_upsert_provider.engine.sources.directory import DirectorySource, Segment


def open_source(uri: str, source_format: str) -> DirectorySource:
    """``dir:/path`` (a landing directory of segment files)."""
    scheme, _, rest = uri.partition(":")
    if scheme == "dir" and rest:
        return DirectorySource(rest, source_format)
    raise ConfigurationError(
        f"unsupported source {uri!r}: expected dir:/path/to/landing", field="source"
    )


__all__ = ["DirectorySource", "Segment", "open_source"]
