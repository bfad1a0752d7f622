"""The names of Iceberg tables a publish accepts: ``NAMESPACE.TABLE``, every level of it a
safe directory name of the table's location. Pure."""

from __future__ import annotations

from airflow_upsert_provider.engine.errors import ConfigurationError

# What a level of a table's name may not hold or exceed: it is one directory of the location.
PATH_SEPARATORS = ("/", "\\")
MAX_NAME_PART_BYTES = 255


def parse_table_identifier(text: str) -> tuple[str, ...]:
    """``NAMESPACE.TABLE`` (a namespace may have several levels: ``a.b.TABLE``) as a tuple;
    a :class:`ConfigurationError` (``field: iceberg``) for anything else. Every part becomes
    one directory of the table's location (``<warehouse>/<namespace>/<table>``), so it must
    be a safe path part: a ``/`` would nest one table inside another's location (where an
    orphan-file removal of the outer table deletes the inner one's files)."""
    parts = tuple(text.split(".")) if isinstance(text, str) else ()
    if len(parts) < 2 or any(not p or p != p.strip() for p in parts):
        raise ConfigurationError(
            f"Iceberg table {text!r} is not NAMESPACE.TABLE (e.g. analytics.orders)", field="iceberg"
        )
    for part in parts:
        problem = unsafe_name_part(part)
        if problem is not None:
            raise ConfigurationError(f"Iceberg table {text!r}: the name {part!r} {problem}", field="iceberg")
    return parts


def unsafe_name_part(part: str) -> str | None:
    """Why ``part`` (one level of a table's name) cannot be a directory of its location, or
    None when it can: no path separator, no control or other unprintable character, and no
    longer than a file name may be. Pure."""
    separators = [ch for ch in PATH_SEPARATORS if ch in part]
    if separators:
        return f"holds {separators[0]!r}, a path separator: use letters, digits, '_' or '-'"
    if not part.isprintable():
        return "holds a control or unprintable character"
    if len(part.encode("utf-8")) > MAX_NAME_PART_BYTES:
        return (f"is {len(part.encode('utf-8'))} bytes long: a directory name may have at most "
                f"{MAX_NAME_PART_BYTES}")
    return None
