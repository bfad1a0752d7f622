"""The Asset URI scheme of a shard, ``upsert://<upsert connection id>/<shard id>``, and its
normalizer, which Airflow applies to every Asset URI of the scheme (the provider info's
``asset-uris``). Imports nothing of Airflow: the providers manager loads it by name."""

from __future__ import annotations

import re
from urllib.parse import SplitResult

ASSET_SCHEME = "upsert"
# An Airflow connection id as the operators take one: no spaces, slashes or URI delimiters.
CONN_ID = re.compile(r"[A-Za-z0-9_.\-]{1,250}")


def normalize_shard_uri(parts: SplitResult) -> SplitResult:
    """The normal form of a shard's Asset URI (Airflow has already lower-cased the scheme,
    dropped the fragment and trailing slashes): the connection id and the shard id as written
    (both are case-sensitive names), no query. Anything else is a ``ValueError`` naming the
    URI and what is wrong, so a typo in a DAG's outlet fails its parse instead of naming an
    asset no task ever updates."""
    from airflow_upsert_provider.engine.config import validate_shard_id
    from airflow_upsert_provider.engine.errors import ConfigurationError

    uri = f"{parts.scheme}://{parts.netloc}{parts.path}" + (f"?{parts.query}" if parts.query else "")
    if not CONN_ID.fullmatch(parts.netloc or ""):
        raise ValueError(f"shard asset {uri!r}: expected upsert://<upsert connection id>/<shard id>; "
                         f"{parts.netloc!r} is not a connection id")
    shard = parts.path[1:] if parts.path.startswith("/") else parts.path
    try:
        validate_shard_id(shard)
    except ConfigurationError as exc:
        raise ValueError(f"shard asset {uri!r}: {exc.message}") from None
    if parts.query:
        raise ValueError(f"shard asset {uri!r}: a shard's asset URI takes no query")
    return SplitResult(parts.scheme, parts.netloc, f"/{shard}", "", "")
