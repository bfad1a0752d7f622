"""How a shard's table schema may change: pure rules over Spark schema JSON.

A schema is Spark's StructType JSON (``{"type": "struct", "fields": [...]}``); a field is
``{"name", "type", "nullable", "metadata"}``. Every rule here takes schemas and returns a new
schema or raises :class:`SchemaChangeRefused` naming the column, its old and new type and
what to do; none reads a store (engine/table/schema_changes.py records what they decide).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from airflow_upsert_provider.engine.config import INTERNAL_COLUMNS
from airflow_upsert_provider.engine.errors import BatchSchemaRefused, ConfigurationError, SchemaChangeRefused


def type_name(spark_type: Any) -> str:
    """A field's type as a message shows it: ``long``, ``decimal(10,2)``, or the JSON of a
    nested type."""
    return spark_type if isinstance(spark_type, str) else json.dumps(spark_type, sort_keys=True)


def schema_fields(schema: str) -> list[dict[str, Any]]:
    return json.loads(schema)["fields"]


def add_column(schema: str, field: dict[str, Any], *, shard_id: str) -> str | None:
    """``schema`` with ``field`` appended as a new nullable column; None when ``schema``
    already has exactly that column (the change was made: nothing to do).

    Refused: a name the schema has with another type (or case), a name the engine reserves,
    a column that is NOT NULL (the rows written before it have no value for it)."""
    name, new_type = field["name"], field["type"]
    details = {"shard": shard_id, "column": name, "new_type": type_name(new_type), "field": "column"}
    if name in INTERNAL_COLUMNS:
        raise SchemaChangeRefused(
            f"cannot add column {name!r} to shard {shard_id!r}: the name is reserved by the engine; "
            "choose another name", **details, old_type=None,
        )
    if not field.get("nullable", True):
        raise SchemaChangeRefused(
            f"cannot add column {name!r} {type_name(new_type)} NOT NULL to shard {shard_id!r}: the rows written "
            "before it have no value for it, so a new column is nullable; add it without NOT NULL",
            **details, old_type=None,
        )
    fields = schema_fields(schema)
    for existing in fields:
        if existing["name"].lower() != name.lower():
            continue
        if existing["name"] == name and existing["type"] == new_type:
            return None
        raise SchemaChangeRefused(
            f"cannot add column {name!r} {type_name(new_type)} to shard {shard_id!r}: it has column "
            f"{existing['name']!r} {type_name(existing['type'])} (names are compared case-insensitively); a "
            "column's type is never changed in place: add a column of another name",
            **details, old_type=type_name(existing["type"]),
        )
    added = {"name": name, "type": new_type, "nullable": True, "metadata": field.get("metadata") or {}}
    return json.dumps({**json.loads(schema), "fields": [*fields, added]})


# -- evolution policies -------------------------------------------------------------------

NONE, ADD_COLUMNS, ADD_AND_WIDEN = "none", "add_columns", "add_and_widen"
POLICIES = (NONE, ADD_COLUMNS, ADD_AND_WIDEN)

# Integral types, narrowest first: each widens to any after it.
INTEGRAL = ("byte", "short", "integer", "long")
FLOATING = ("float", "double")
_DECIMAL = re.compile(r"^decimal\((\d+),\s*(\d+)\)$")


def check_policy(policy: str) -> str:
    if policy not in POLICIES:
        raise ConfigurationError(
            f"unknown schema evolution policy {policy!r}; expected one of {', '.join(POLICIES)}",
            field="schema_evolution",
        )
    return policy


# The policy of a shard created without one, and of a shard created before policies existed
# (docs/schema.md says why).
DEFAULT_POLICY = ADD_COLUMNS


def effective_policy(stored: str | None) -> str:
    """A shard's policy given what is stored for it: the stored one, else
    :data:`DEFAULT_POLICY`. A stored value this code does not know is an error, never a
    default. Pure."""
    return DEFAULT_POLICY if stored is None else check_policy(stored)


def _decimal(spark_type: Any) -> tuple[int, int] | None:
    match = _DECIMAL.match(spark_type) if isinstance(spark_type, str) else None
    return None if match is None else (int(match.group(1)), int(match.group(2)))


def _is_struct(spark_type: Any) -> bool:
    return isinstance(spark_type, dict) and spark_type.get("type") == "struct"


def widens(old: Any, new: Any) -> bool:
    """Whether a column of type ``old`` may become ``new`` by widening alone (every value of
    ``old`` is a value of ``new``, and nothing else changes): an integral type to a wider one
    (int -> bigint), float -> double, a decimal to a higher precision of the same scale, a
    struct to one with nested fields added (nullable) or widened. Equal types do not widen. Pure."""
    if old == new:
        return False
    if old in INTEGRAL and new in INTEGRAL:
        return INTEGRAL.index(new) > INTEGRAL.index(old)
    if old in FLOATING and new in FLOATING:
        return FLOATING.index(new) > FLOATING.index(old)
    old_dec, new_dec = _decimal(old), _decimal(new)
    if old_dec and new_dec:
        return new_dec[1] == old_dec[1] and new_dec[0] > old_dec[0]
    if _is_struct(old) and _is_struct(new):
        old_fields = {f["name"]: f for f in old["fields"]}
        new_names = [f["name"] for f in new["fields"]]
        if new_names[: len(old_fields)] != list(old_fields):
            return False  # a nested field dropped, renamed or moved
        for f in new["fields"]:
            before = old_fields.get(f["name"])
            if before is None:
                if not f.get("nullable", True):
                    return False
            elif f.get("nullable", True) != before.get("nullable", True) and not f.get("nullable", True):
                return False
            elif before["type"] != f["type"] and not widens(before["type"], f["type"]):
                return False
        return True
    return False


def fits(column: Any, observed: Any) -> bool:
    """Whether values observed as ``observed`` are values of a column of type ``column`` as it
    is (no change needed): the same type, a narrower one it widens from, or a struct whose
    nested fields all fit. Pure."""
    if column == observed or widens(observed, column):
        return True
    if _is_struct(column) and _is_struct(observed):
        nested = {f["name"]: f["type"] for f in column["fields"]}
        return all(f["name"] in nested and fits(nested[f["name"]], f["type"]) for f in observed["fields"])
    return False


def merged_type(column: Any, observed: Any) -> Any | None:
    """The type a column of type ``column`` needs to hold values observed as ``observed``:
    ``column`` itself when they fit, the wider of the two when ``observed`` widens it, for two
    structs the column's nested fields (each merged) followed by the nested fields only
    ``observed`` has (nullable); None when no widening holds both (a type change). Pure."""
    if fits(column, observed):
        return column
    if widens(column, observed):
        return observed
    if not (_is_struct(column) and _is_struct(observed)):
        return None
    seen = {f["name"]: f for f in observed["fields"]}
    fields = []
    for f in column["fields"]:
        if f["name"] in seen:
            inner = merged_type(f["type"], seen[f["name"]]["type"])
            if inner is None:
                return None
            f = {**f, "type": inner}
        fields.append(f)
    known = {f["name"] for f in column["fields"]}
    fields += [{**f, "nullable": True} for f in observed["fields"] if f["name"] not in known]
    return {**column, "fields": fields}


@dataclass(frozen=True)
class ObservedField:
    """A top-level field a batch's records carry: its name, the type its values were read as
    (Spark JSON; inferred from a JSON Lines file's values, a Parquet file's column type) and
    the file (or Kafka position) where it was seen."""

    name: str
    type: Any
    where: str


@dataclass(frozen=True)
class Evolution:
    """What a batch does to the schema: the new schema (None: unchanged), the columns it adds
    and widens (``{name, old_type, new_type}``), and under policy ``none`` the fields the
    schema does not name (each record carrying one is a bad record naming it)."""

    schema: str | None
    added: tuple[dict[str, Any], ...] = ()
    widened: tuple[dict[str, Any], ...] = ()
    unknown: tuple[str, ...] = ()

    def change(self) -> dict[str, Any]:
        """The change as a schema version records it."""
        return {k: list(v) for k, v in (("add", self.added), ("widen", self.widened)) if v}


def widening_refusal(column: str, wider: Any | None, policy: str, *, locked: set[str]) -> str | None:
    """Why a batch may not widen ``column`` to ``wider`` (None: no widening holds its values)
    under ``policy``, or None when it does: only ``add_and_widen`` widens, never a key or the
    order column (``locked``). One rule for JSON values, Parquet files and Kafka fields. Pure."""
    if column in locked:
        return "a key or the order column never changes type"
    if wider is None:
        return ("a column's type never changes in place (only widens: int to bigint, float to double, "
                "decimal precision up, nested fields added)")
    if policy != ADD_AND_WIDEN:
        return f"policy {policy} does not widen a column (add_and_widen does)"
    return None


def locked_columns(keys: Sequence[str], order_by: str | None) -> set[str]:
    return {*keys, *([order_by] if order_by else [])}


def evolve(
    schema: str, observed: Sequence[ObservedField], policy: str, *, keys: Sequence[str], order_by: str | None,
    shard_id: str,
) -> Evolution:
    """The schema a batch that carries ``observed`` fields is written with, under ``policy``.

    - A field the schema names whose values fit its column: nothing.
    - A field the schema names with a wider type: widened under ``add_and_widen`` (never a key
      or the order column); refused otherwise.
    - Any other type change: refused, naming the column, both types and where it was seen.
    - A field the schema does not name: under ``none`` listed in ``unknown``; otherwise a new
      nullable column of its observed type, after the existing ones in the order first seen.
      Files that disagree on its type are refused, naming both.

    Deterministic: the same schema and observations (in any order) give the same result, so
    writers racing through one batch plan one version. Refusals are :class:`BatchSchemaRefused`."""
    check_policy(policy)
    fields = schema_fields(schema)
    by_lower = {f["name"].lower(): f for f in fields}
    locked = locked_columns(keys, order_by)
    # One type per new field, first seen (by where, then name) naming where.
    new_types: dict[str, ObservedField] = {}
    widened: dict[str, dict[str, Any]] = {}
    unknown: list[str] = []
    for seen in sorted(observed, key=lambda o: (o.name, o.where, json.dumps(o.type, sort_keys=True))):
        column = by_lower.get(seen.name.lower())
        details = {"shard": shard_id, "column": seen.name, "new_type": type_name(seen.type), "file": seen.where,
                   "policy": policy}
        if column is not None and column["name"] != seen.name:
            raise BatchSchemaRefused(
                f"shard {shard_id!r}: field {seen.name!r} in {seen.where} differs only in case from column "
                f"{column['name']!r} (names are compared case-insensitively); rename the field upstream",
                **details, old_type=type_name(column["type"]),
            )
        if column is None:
            first = new_types.get(seen.name)
            if first is not None and first.type != seen.type:
                raise BatchSchemaRefused(
                    f"shard {shard_id!r}: the batch's files disagree on the type of new field {seen.name!r}: "
                    f"{type_name(first.type)} in {first.where}, {type_name(seen.type)} in {seen.where}; write it "
                    "with one type, or add the column with `upsertctl schema add-column` first",
                    **{**details, "old_type": type_name(first.type), "files": [first.where, seen.where]},
                )
            if first is None:
                new_types[seen.name] = seen
            continue
        current = widened.get(seen.name, {}).get("new_type", column["type"])
        target = merged_type(current, seen.type)
        if target == current:
            continue
        what = widening_refusal(seen.name, target, policy, locked=locked)
        if what is not None:
            raise BatchSchemaRefused(
                f"shard {shard_id!r}: column {seen.name!r} is {type_name(current)}, {seen.where} has it as "
                f"{type_name(seen.type)}: {what}; fix the data upstream or write it to a new column",
                **details, old_type=type_name(current),
            )
        widened[seen.name] = {"name": seen.name, "old_type": column["type"], "new_type": target}
    if policy == NONE:
        return Evolution(None, unknown=tuple(sorted(new_types)))
    added = tuple({"name": o.name, "type": o.type} for o in sorted(new_types.values(), key=lambda o: (o.where, o.name)))
    if not added and not widened:
        return Evolution(None)
    out = [{**f, "type": widened[f["name"]]["new_type"]} if f["name"] in widened else f for f in fields]
    out += [{"name": a["name"], "type": a["type"], "nullable": True, "metadata": {}} for a in added]
    return Evolution(json.dumps({**json.loads(schema), "fields": out}), added, tuple(widened.values()))


def check_change(old: str, new: str, policy: str, *, keys: Sequence[str], order_by: str | None, shard_id: str) -> None:
    """Refuse a change of the schema from ``old`` to ``new`` that no policy allows, or that
    ``policy`` does not: a column dropped or renamed, a type narrowed or changed, NULL made NOT
    NULL, a key or the order column changed, a column added as NOT NULL; under ``none`` any
    change, under ``add_columns`` a widening. Raises :class:`SchemaChangeRefused`. Pure."""
    check_policy(policy)
    old_fields, new_fields = schema_fields(old), schema_fields(new)
    new_by_name = {f["name"]: f for f in new_fields}
    locked = locked_columns(keys, order_by)

    def refuse(column: str, old_type: Any, new_type: Any, what: str) -> SchemaChangeRefused:
        return SchemaChangeRefused(
            f"cannot change column {column!r} of shard {shard_id!r} from {type_name(old_type)} to "
            f"{type_name(new_type)}: {what}",
            shard=shard_id, column=column, old_type=type_name(old_type), new_type=type_name(new_type),
            policy=policy, field="schema",
        )

    for position, before in enumerate(old_fields):
        after = new_by_name.get(before["name"])
        if after is None:
            moved = new_fields[position] if position < len(new_fields) else None
            if moved is not None and moved["name"] not in {f["name"] for f in old_fields}:
                raise refuse(before["name"], before["type"], moved["type"],
                             f"a rename (to {moved['name']!r}) is not supported: add a column under the new name")
            raise refuse(before["name"], before["type"], None,
                         "a column is never dropped (old runs and readers depend on it): stop writing it instead")
        if before.get("nullable", True) and not after.get("nullable", True):
            raise refuse(before["name"], before["type"], after["type"], "NULL to NOT NULL is not supported")
        if before["type"] == after["type"] and (
            before.get("nullable", True) == after.get("nullable", True) or before["name"] not in locked
        ):
            continue  # unchanged, or NOT NULL relaxed to NULL (every old value is still valid)
        if before["name"] in locked:
            raise refuse(before["name"], before["type"], after["type"], "a key or the order column never changes")
        if widens(before["type"], after["type"]):
            if policy != ADD_AND_WIDEN:
                raise refuse(before["name"], before["type"], after["type"],
                             f"a widening, which policy {policy} does not allow (add_and_widen does)")
            continue
        what = "a narrowing" if widens(after["type"], before["type"]) else "a type change"
        raise refuse(before["name"], before["type"], after["type"],
                     f"{what} is not supported: add a column of another name")
    for before, after in zip(old_fields, new_fields):
        if before["name"] != after["name"]:
            raise refuse(after["name"], new_by_name[after["name"]]["type"], after["type"],
                         "columns keep their order: new ones go last")
    for added in new_fields[len(old_fields):]:
        if policy == NONE:
            raise refuse(added["name"], None, added["type"],
                         "policy none adds no column (add_columns does; or `upsertctl schema add-column`)")
        if not added.get("nullable", True):
            raise refuse(added["name"], None, added["type"], "a new column is nullable (older rows have no value)")
