"""The types of a JSON Lines batch's new fields, taken on the driver when they hold scalars
(engine/write/records.py ``jsonl_scalar_types``) instead of by a Spark inference job per file:
equal to Spark's inference over every sequence of scalar kinds, and no Spark job for such a
batch."""

from __future__ import annotations

import itertools
import json

from airflow_upsert_provider.engine.sources import Segment
from airflow_upsert_provider.engine.table.schema_evolution import ADD_COLUMNS, ObservedField
from airflow_upsert_provider.engine.write.records import JSON_OPTIONS, jsonl_scalar_types, observed_jsonl_fields
from tests.helpers import sample_config

ABSENT = object()
# Each scalar kind Spark's JSON inference tells apart, at the edges of bigint's range, and a
# field's absence from a record.
SCALARS = [ABSENT, None, True, False, 0, 7, -(2 ** 63), 2 ** 63 - 1, 2.5, -1e300, "x", ""]


def _lines(records: list[dict]) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


def test_anything_but_an_object_of_scalars_is_left_to_spark():
    fields = {"n"}
    assert jsonl_scalar_types([{"n": 1}, {"id": 2}], fields) == {"n": "long"}
    assert jsonl_scalar_types([{"n": None}], fields) == {}
    # Spark's inference reads an empty string as null.
    assert jsonl_scalar_types([{"n": ""}, {"n": 1}], fields) == {"n": "long"}
    for value in ({"a": 1}, [1], [], 2 ** 63, -(2 ** 63) - 1):
        assert jsonl_scalar_types([{"n": 1}, {"n": value}], fields) is None, value
    # Spark reads a line's top-level array as records, a top-level scalar as corrupt.
    for record in ([{"n": 1}], 3, "n", None):
        assert jsonl_scalar_types([{"n": 1}, record], fields) is None, record
    # A value of a field not asked about is not looked at.
    assert jsonl_scalar_types([{"n": 1, "m": {"a": [1]}}], fields) == {"n": "long"}


def test_scalar_types_equal_sparks_inference_over_every_pair_and_triple_of_kinds(spark, tmp_path):
    """One file, one field per sequence of values (every pair of the scalars in both orders,
    every triple of one of each kind), inferred by Spark once with the options a batch uses."""
    one_of_each_kind = [ABSENT, None, True, 7, 2.5, "x", ""]
    sequences = [(*pair, ABSENT) for pair in itertools.product(SCALARS, repeat=2)]
    sequences += [t for t in itertools.product(one_of_each_kind, repeat=3) if t not in sequences]
    fields = {f"f{i}": sequence for i, sequence in enumerate(sequences)}
    records = [{"id": line, **{name: seq[line] for name, seq in fields.items() if seq[line] is not ABSENT}}
               for line in range(3)]
    path = tmp_path / "batch.jsonl"
    path.write_text(_lines(records))
    reader = spark.read.option("dropFieldIfAllNull", "true")
    for option, setting in JSON_OPTIONS.items():
        reader = reader.option(option, setting)
    inferred = {f.name: f.dataType.jsonValue() for f in reader.json(str(path)).schema.fields}
    driver = jsonl_scalar_types(records, set(fields))
    assert driver is not None
    mismatches = {name: (fields[name], driver.get(name), inferred.get(name)) for name in fields
                  if driver.get(name) != inferred.get(name)}
    assert not mismatches, list(mismatches.items())[:5]
    assert {driver[f"f{sequences.index((7, 2.5, ABSENT))}"], driver[f"f{sequences.index((True, 7, None))}"]} == {
        "double", "string"}


def test_a_batch_whose_new_fields_hold_scalars_is_typed_without_sparks_inference(spark, tmp_path, monkeypatch):
    landing = tmp_path / "landing"
    (landing / "p0").mkdir(parents=True)
    config = sample_config(str(landing))
    base = {"id": 1, "name": "a", "amount": 1.5, "updated_at": 1, "deleted": False}
    files = {
        "1.jsonl": [{**base, "email": "a@example.com", "rank": 3}, {**base, "rank": 2.5}],
        "2.jsonl": [{**base, "email": None}, {**base, "rank": True, "email": 4}],
        # An object: Spark's inference types this file.
        "3.jsonl": [{**base, "meta": {"b": None, "a": [1]}}],
    }
    segments = []
    for seq, (name, records) in enumerate(files.items()):
        (landing / "p0" / name).write_text(_lines(records))
        segments.append(Segment(seq, "p0", str(landing / "p0" / name)))
    where = {name: str(landing / "p0" / name) for name in files}
    # Spark's JSON inference is a read of the file with ``spark.read.json``; the check of which
    # records pass (accepted_field_counts) reads the files as text, and runs either way.
    from pyspark.sql.readwriter import DataFrameReader

    inferred: list[object] = []
    real_json = DataFrameReader.json

    def spied_json(reader, path, *args, **kwargs):
        inferred.append(path)
        return real_json(reader, path, *args, **kwargs)

    monkeypatch.setattr(DataFrameReader, "json", spied_json)
    scalars = observed_jsonl_fields(spark, config, segments[:2], ADD_COLUMNS)
    inferred_for_scalars = list(inferred)
    nested = observed_jsonl_fields(spark, config, segments, ADD_COLUMNS)
    assert sorted(scalars, key=lambda o: (o.where, o.name)) == [
        ObservedField("email", "string", where["1.jsonl"]), ObservedField("rank", "double", where["1.jsonl"]),
        ObservedField("email", "long", where["2.jsonl"]), ObservedField("rank", "boolean", where["2.jsonl"]),
    ]
    assert inferred_for_scalars == []
    # The object's file alone is inferred by Spark (dropFieldIfAllNull drops its null member).
    assert [o for o in nested if o.where == where["3.jsonl"]] == [ObservedField("meta", {
        "type": "struct", "fields": [{"name": "a", "type": {"type": "array", "elementType": "long",
                                                            "containsNull": True}, "nullable": True, "metadata": {}}]},
        where["3.jsonl"])]
    assert inferred[len(inferred_for_scalars):] == [where["3.jsonl"]]
