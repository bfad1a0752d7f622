"""The evolution policies as pure rules (engine/table/schema_evolution.py), swept over every
pair of a grid of column types, every policy and every role a column has (value, key, order
column). No Spark, no store."""

from __future__ import annotations

import itertools
import json
import random

import pytest

from airflow_upsert_provider.engine.errors import BatchSchemaRefused, ConfigurationError, SchemaChangeRefused
from airflow_upsert_provider.engine.table.schema_evolution import (
    ADD_AND_WIDEN,
    NONE,
    POLICIES,
    ObservedField,
    check_change,
    evolve,
    fits,
    merged_type,
    type_name,
    widens,
)


def struct(*fields: tuple[str, object], nullable: bool = True) -> dict:
    return {"type": "struct", "fields": [{"name": n, "type": t, "nullable": nullable, "metadata": {}} for n, t in fields]}


TYPES = [
    "byte", "short", "integer", "long", "float", "double",
    "decimal(9,2)", "decimal(12,2)", "decimal(12,3)", "decimal(20,0)",
    "string", "boolean", "date", "timestamp", "binary",
    {"type": "array", "elementType": "integer", "containsNull": True},
    struct(("a", "integer")), struct(("a", "long")), struct(("a", "integer"), ("b", "string")),
    struct(("b", "string")), struct(("a", "string")), struct(("a", "integer"), ("b", "string"), nullable=False),
]

# The widenings the docs promise, written out pair by pair (the oracle the rule is held to).
INTEGRAL = ["byte", "short", "integer", "long"]
EXPECTED_WIDENINGS = {
    *((INTEGRAL[i], INTEGRAL[j]) for i in range(4) for j in range(i + 1, 4)),
    ("float", "double"),
    ("decimal(9,2)", "decimal(12,2)"),
    (json.dumps(struct(("a", "integer"))), json.dumps(struct(("a", "long")))),
    (json.dumps(struct(("a", "integer"))), json.dumps(struct(("a", "integer"), ("b", "string")))),
    # Nested NOT NULL relaxed to NULL: every old value is still a value.
    (json.dumps(struct(("a", "integer"), ("b", "string"), nullable=False)),
     json.dumps(struct(("a", "integer"), ("b", "string")))),
}


def key(t: object) -> str:
    return t if isinstance(t, str) else json.dumps(t)


def schema_of(column_type: object) -> str:
    fields = [("id", "long"), ("updated_at", "long"), ("c", column_type)]
    return json.dumps({"type": "struct", "fields": [
        {"name": n, "type": t, "nullable": True, "metadata": {}} for n, t in fields]})


ROLES = {"value": "c", "key": "id", "order": "updated_at"}


def test_widens_is_exactly_the_documented_widenings_and_a_strict_order():
    for old, new in itertools.product(TYPES, TYPES):
        assert widens(old, new) == ((key(old), key(new)) in EXPECTED_WIDENINGS), (old, new)
        # Irreflexive and antisymmetric; fits is widens or equal, except nested partial structs.
        assert not (widens(old, new) and widens(new, old))
        if old == new or widens(new, old):
            assert fits(old, new), (old, new)
    for a, b, c in itertools.product(TYPES, TYPES, TYPES):
        if widens(a, b) and widens(b, c):
            assert widens(a, c), (a, b, c)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("role", sorted(ROLES))
def test_a_batch_observing_each_type_in_each_column_is_kept_widened_or_refused_naming_both_types(policy, role):
    for old, new in itertools.product(TYPES, TYPES):
        column = ROLES[role]
        column_type = old if role == "value" else "long"
        schema = schema_of(old) if role == "value" else schema_of("string")
        seen = [ObservedField(column, new, "/landing/p0/7.jsonl")]
        try:
            result = evolve(schema, seen, policy, keys=["id"], order_by="updated_at", shard_id="orders")
        except BatchSchemaRefused as refused:
            assert not fits(column_type, new), (old, new)
            assert refused.details["column"] == column and refused.details["file"] == "/landing/p0/7.jsonl"
            assert (refused.details["old_type"], refused.details["new_type"]) == (type_name(column_type), type_name(new))
            assert type_name(column_type) in refused.message and type_name(new) in refused.message
            assert refused.exit_code == 3
            allowed = policy == ADD_AND_WIDEN and role == "value" and merged_type(column_type, new) is not None
            assert not allowed, (old, new)
            continue
        if fits(column_type, new):
            assert result.schema is None and not result.added and not result.widened
            continue
        # Only a widening of a value column under add_and_widen gets here.
        target = merged_type(column_type, new)
        assert policy == ADD_AND_WIDEN and role == "value" and target is not None, (old, new)
        assert widens(column_type, target) and fits(target, new), (old, new, target)
        fields = json.loads(result.schema)["fields"]
        assert [f["name"] for f in fields] == ["id", "updated_at", "c"] and fields[2]["type"] == target
        assert result.widened == ({"name": "c", "old_type": old, "new_type": target},)
        check_change(schema, result.schema, policy, keys=["id"], order_by="updated_at", shard_id="orders")


@pytest.mark.parametrize("policy", POLICIES)
def test_a_new_field_of_each_type_becomes_a_nullable_column_or_under_none_is_named_unknown(policy):
    schema = schema_of("string")
    for new in TYPES:
        seen = [ObservedField("discount", new, "/landing/p0/7.jsonl"), ObservedField("discount", new, "/landing/p1/7.jsonl")]
        result = evolve(schema, seen, policy, keys=["id"], order_by="updated_at", shard_id="orders")
        if policy == NONE:
            assert result.schema is None and result.unknown == ("discount",)
            continue
        fields = json.loads(result.schema)["fields"]
        assert fields[-1] == {"name": "discount", "type": new, "nullable": True, "metadata": {}}
        assert fields[:-1] == json.loads(schema)["fields"]
        assert result.change() == {"add": [{"name": "discount", "type": new}]}
        check_change(schema, result.schema, policy, keys=["id"], order_by="updated_at", shard_id="orders")


@pytest.mark.parametrize("policy", POLICIES)
def test_files_that_disagree_on_a_new_fields_type_are_refused_naming_both(policy):
    schema = schema_of("string")
    for first, second in itertools.permutations(TYPES, 2):
        seen = [ObservedField("discount", second, "/landing/p1/8.jsonl"), ObservedField("discount", first, "/landing/p0/8.jsonl")]
        with pytest.raises(BatchSchemaRefused) as refused:
            evolve(schema, seen, policy, keys=["id"], order_by="updated_at", shard_id="orders")
        assert refused.value.details["files"] == ["/landing/p0/8.jsonl", "/landing/p1/8.jsonl"] or \
            refused.value.details["files"] == ["/landing/p1/8.jsonl", "/landing/p0/8.jsonl"]
        assert "/landing/p0/8.jsonl" in refused.value.message and "/landing/p1/8.jsonl" in refused.value.message


def test_nested_fields_merge_into_the_struct_column():
    a_int, b_str = ("a", "integer"), ("b", "string")
    cases = [
        (struct(a_int), struct(b_str), struct(a_int, b_str)),
        (struct(a_int), struct(("a", "long"), b_str), struct(("a", "long"), b_str)),
        (struct(a_int, b_str), struct(b_str), struct(a_int, b_str)),
        (struct(a_int), struct(("a", "string")), None),
        (struct(a_int), "string", None),
        ("integer", "long", "long"),
        ("long", "integer", "long"),
        ("decimal(12,2)", "decimal(12,3)", None),
    ]
    for column, observed, expected in cases:
        assert merged_type(column, observed) == expected, (column, observed)


def test_the_result_does_not_depend_on_the_order_fields_were_observed_in():
    rng = random.Random(36)
    schema = schema_of("integer")
    for _ in range(300):
        names = rng.sample(["a", "b", "c", "d", "e"], rng.randrange(1, 6))
        seen = [ObservedField(n, rng.choice(["long", "string", "double"]), f"/l/p{rng.randrange(3)}/{rng.randrange(9)}.jsonl")
                for n in names for _ in range(rng.randrange(1, 3))]
        # One type per new field across files (disagreement is its own test); "c" widens or fits.
        types = {n: rng.choice(["long", "string", "double"]) for n in names}
        seen = [ObservedField(o.name, "long" if o.name == "c" else types[o.name], o.where) for o in seen]
        results = []
        for _ in range(3):
            rng.shuffle(seen)
            results.append(evolve(schema, list(seen), ADD_AND_WIDEN, keys=["id"], order_by="updated_at",
                                  shard_id="orders"))
        assert results[0] == results[1] == results[2]


@pytest.mark.parametrize("policy", POLICIES)
def test_explicit_changes_drops_renames_narrowing_not_null_and_key_changes_are_refused(policy):
    base = json.loads(schema_of("integer"))

    def changed(fields) -> str:
        return json.dumps({**base, "fields": fields})

    id_, order, value = base["fields"]
    cases = {
        "drop": [id_, order],
        "rename": [id_, order, {**value, "name": "c2"}],
        "narrowing": [id_, order, {**value, "type": "short"}],
        "type change": [id_, order, {**value, "type": "string"}],
        "not null": [id_, order, {**value, "nullable": False}],
        "key widened": [{**id_, "type": "decimal(20,0)"}, order, value],
        "order changed": [id_, {**order, "type": "string"}, value],
        "reordered": [id_, value, order],
        "added not null": [id_, order, value, {"name": "d", "type": "long", "nullable": False, "metadata": {}}],
    }
    for what, fields in cases.items():
        with pytest.raises(SchemaChangeRefused) as refused:
            check_change(json.dumps(base), changed(fields), policy, keys=["id"], order_by="updated_at", shard_id="orders")
        assert refused.value.exit_code == 2 and refused.value.details["column"], what
    widened = changed([id_, order, {**value, "type": "long"}])
    added = changed([id_, order, value, {"name": "d", "type": "long", "nullable": True, "metadata": {}}])
    relaxed = changed([id_, order, value])
    check_change(json.dumps(base), relaxed, policy, keys=["id"], order_by="updated_at", shard_id="orders")
    for proposed, allowed in ((widened, policy == ADD_AND_WIDEN), (added, policy != NONE)):
        if allowed:
            check_change(json.dumps(base), proposed, policy, keys=["id"], order_by="updated_at", shard_id="orders")
        else:
            with pytest.raises(SchemaChangeRefused, match=f"policy {policy}"):
                check_change(json.dumps(base), proposed, policy, keys=["id"], order_by="updated_at", shard_id="orders")


def test_an_unknown_policy_is_refused_naming_the_field():
    with pytest.raises(ConfigurationError) as refused:
        evolve(schema_of("long"), [], "merge", keys=["id"], order_by=None, shard_id="orders")
    assert refused.value.details == {"field": "schema_evolution"} and "add_and_widen" in refused.value.message
