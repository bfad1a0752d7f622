"""The Iceberg catalog a publish writes through: its PyIceberg properties (the SQL catalog in
the consensus store by default, another SQL database or a REST catalog when named, or an
Iceberg catalog connection's), opening and closing it, and the error of a catalog that
cannot be used. The properties hold secrets: never log them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow_upsert_provider.engine.errors import ConfigurationError, ConsensusUnavailable, UpsertError, first_line
from airflow_upsert_provider.engine.store.urls import (
    POSTGRES_TIMEOUT_DEFAULTS,
    SQLITE_DEFAULT_TIMEOUT_S,
    normalize_url,
    redact_url,
    with_password,
)

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog

# The catalog's name inside PyIceberg (the SQL catalog keys its rows by it).
CATALOG_NAME = "upsert"
# Where the default catalog's tables live, below the blob root. A shard id starts with a
# letter or a digit, so no shard's directory is named so.
WAREHOUSE_DIR = "_iceberg"
# Database URLs a SQL catalog opens (the consensus store's backends).
SQL_CATALOG_SCHEMES = ("sqlite", "postgresql", "postgres")


def catalog_sql_url(consensus_url: str) -> str:
    """The SQLAlchemy URL PyIceberg's SQL catalog opens for a consensus store's URL: the same
    database and driver, without the options only the engine reads (PostgreSQL's session
    timeouts and ``options``). SQLite's options are the driver's own; without a ``timeout``
    the catalog waits for the write lock as long as the store's writers do, not the driver's
    5 s."""
    from sqlalchemy.engine import make_url

    parsed = make_url(normalize_url(consensus_url))
    if parsed.get_backend_name() == "postgresql":
        parsed = parsed.difference_update_query([*POSTGRES_TIMEOUT_DEFAULTS, "options"])
    elif parsed.get_backend_name() == "sqlite" and "timeout" not in parsed.query:
        parsed = parsed.update_query_dict({"timeout": str(SQLITE_DEFAULT_TIMEOUT_S)})
    return parsed.render_as_string(hide_password=False)


def warehouse_location(blob_root: str) -> str:
    """Where the default catalog puts its tables: ``<blob root>/_iceberg``, as a URI PyIceberg
    takes (``file://`` for a local root)."""
    import os

    if "://" in blob_root:
        return f"{blob_root.rstrip('/')}/{WAREHOUSE_DIR}"
    return "file://" + os.path.join(os.path.abspath(blob_root), WAREHOUSE_DIR)


def catalog_properties(consensus_url: str, blob_root: str, catalog_uri: str | None = None) -> dict[str, str]:
    """PyIceberg's properties of the catalog a publish uses. Pure.

    - no ``catalog_uri``: the SQL catalog in the consensus store itself (its tables
      ``iceberg_tables`` and ``iceberg_namespace_properties`` beside ours, which are all
      named ``upsert_*``), tables under ``<blob root>/_iceberg``;
    - ``http://`` or ``https://``: a REST catalog at that URL, which decides where tables go;
    - a database URL (``sqlite:///...``, ``postgresql://...``): the SQL catalog there, tables
      under ``<blob root>/_iceberg``.

    Any other catalog URI is a :class:`ConfigurationError` (``field: catalog_uri``) that
    does not repeat it (it may hold a password). The properties hold the URL's password:
    never log them."""
    if catalog_uri:
        scheme = catalog_uri.split("://", 1)[0].lower() if "://" in catalog_uri else ""
        if scheme in ("http", "https"):
            return {"type": "rest", "uri": catalog_uri}
        if scheme.split("+", 1)[0] not in SQL_CATALOG_SCHEMES:
            shown = f"its scheme is {scheme!r}" if scheme else "it has no scheme"
            raise ConfigurationError(
                f"the Iceberg catalog URI is neither a REST catalog's http[s]:// URL nor a SQL catalog's "
                f"sqlite:/// or postgresql:// database URL ({shown})",
                field="catalog_uri",
            )
    properties = {
        "type": "sql",
        "uri": catalog_sql_url(catalog_uri or consensus_url),
        "warehouse": warehouse_location(blob_root),
    }
    if "://" in blob_root and blob_root.split("://", 1)[0].lower() in ("s3", "s3a"):
        # PyIceberg's own S3 client: the endpoint and region the blob's use; credentials from
        # the environment's chain, as the blob's.
        from airflow_upsert_provider.engine.blob.filesystems import s3_endpoint, s3_region

        if s3_endpoint():
            properties["s3.endpoint"] = s3_endpoint()  # type: ignore[assignment]
        if s3_region():
            properties["s3.region"] = s3_region()  # type: ignore[assignment]
    return properties


def connection_catalog_properties(
    consensus_url: str, blob_root: str, extra: Mapping[str, Any], *, login: str | None = None,
    password: str | None = None, connection: str = "the Iceberg catalog connection",
) -> dict[str, str]:
    """PyIceberg's properties of the catalog an Iceberg catalog connection describes. Pure.

    ``extra`` holds PyIceberg catalog properties as they are (``uri`` required; ``warehouse``,
    ``scope``, ``header.*``, ``s3.*``, ...); ``type`` is optional and must agree with the URI
    (:func:`catalog_properties` decides it). The connection's password is kept out of the
    extra: for a REST catalog it becomes the OAuth2 client ``credential``
    (``LOGIN:PASSWORD``) when a login is given, else the bearer ``token``; for a SQL catalog
    it is the database URL's password. A value that is not a string, number or boolean, or
    a secret also written into the extra, is a :class:`ConfigurationError` naming the key,
    never the value. The result holds the password: never log it."""
    uri = extra.get("uri")
    if not isinstance(uri, str) or not uri:
        raise ConfigurationError(f"{connection}: its extra names no catalog 'uri' (a REST catalog's http[s]:// URL "
                                 "or a SQL catalog's database URL)", field="uri")
    values: dict[str, str] = {}
    for key, value in extra.items():
        if isinstance(value, bool):
            values[key] = "true" if value else "false"
        elif isinstance(value, (str, int, float)):
            values[key] = str(value)
        else:
            raise ConfigurationError(f"{connection}: extra {key!r} is not a string, number or boolean", field=key)
    secret_keys = [key for key in ("credential", "token") if key in values and password]
    if secret_keys:
        raise ConfigurationError(f"{connection}: give the secret once, in the password field, not also as "
                                 f"extra {secret_keys[0]!r}", field=secret_keys[0])
    rest = uri.split("://", 1)[0].lower() in ("http", "https")
    if password and not rest:
        uri = with_password(uri, password)
    properties = catalog_properties(consensus_url, blob_root, uri)
    wanted_type = values.pop("type", properties["type"])
    if wanted_type.lower() != properties["type"]:
        raise ConfigurationError(f"{connection}: extra 'type' is {wanted_type!r}, but its uri is a "
                                 f"{properties['type'].upper()} catalog's", field="type")
    values.pop("uri")
    properties.update(values)
    if password and rest:
        if login:
            properties["credential"] = f"{login}:{password}"
        else:
            properties["token"] = password
    return properties


def describe_catalog(properties: Mapping[str, str]) -> str:
    """The catalog as a message may name it: its kind and URL, the password hidden."""
    return f"{properties['type'].upper()} catalog {redact_url(properties['uri'])}"


def open_catalog(properties: Mapping[str, str]) -> "Catalog":
    """PyIceberg's catalog for ``properties`` (:func:`catalog_properties`). A catalog that
    cannot be reached is :class:`ConsensusUnavailable` (retryable; nothing was changed),
    named without its password. Close it with :func:`close_catalog`."""
    from pyiceberg.catalog import load_catalog

    try:
        return load_catalog(CATALOG_NAME, **properties)
    except UpsertError:
        raise
    except Exception as exc:
        raise _unavailable(properties, exc) from None


def close_catalog(catalog: "Catalog") -> None:
    """Release the catalog's connections (the SQL catalog's engine)."""
    engine = getattr(catalog, "engine", None)
    if engine is not None:
        engine.dispose()


def _unavailable(properties: Mapping[str, str], exc: BaseException) -> UpsertError:
    return catalog_unavailable(describe_catalog(properties), exc, properties.get("uri"))


def catalog_unavailable(where: str, exc: BaseException, secret_url: str | None = None) -> UpsertError:
    """The catalog could not be used before anything was committed: retryable, nothing
    changed. The driver's message is cut to one line and never repeats the URL's password."""
    text = first_line(exc)
    if secret_url:
        text = text.replace(secret_url, redact_url(secret_url))
    return ConsensusUnavailable(
        f"{where} could not be used: {type(exc).__name__}: {text}; nothing was published", catalog=where
    )
