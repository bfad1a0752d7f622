"""`upsertctl` end to end in-process (sharing the test SparkSession): output and exit codes."""

from __future__ import annotations

import csv
import json

import pytest

from airflow_upsert_provider import cli
from airflow_upsert_provider.sample_data import SAMPLE_SCHEMA_DDL, SampleSpec, write_segment
from tests.helpers import landing_env
from tests.helpers import run_cli as run
from tests.oracle import oracle_table

SPEC = SampleSpec(records=2000, keys=400, partitions=2, segments_per_partition=3, seed=21)


@pytest.fixture
def env(tmp_path, monkeypatch):
    return landing_env(tmp_path, monkeypatch, SPEC)


def init(capsys, landing, *extra):
    return run(
        capsys, "init", "orders", "--source", f"dir:{landing}", "--key", "id", "--order-by", "updated_at",
        "--delete-marker", "deleted", "--max-files-per-batch", "2", "--json", *extra,
    )


def test_init_infers_schema_in_record_order(spark, env, capsys):
    code, out, _ = init(capsys, env)
    assert code == 0
    fields = json.loads(json.loads(out)["config"]["schema"])["fields"]
    assert [(f["name"], f["type"]) for f in fields] == [
        ("id", "long"), ("name", "string"), ("amount", "double"), ("updated_at", "long"), ("deleted", "boolean"),
    ]


def test_init_with_a_plain_schema_starts_no_spark(env, capsys, monkeypatch):
    from airflow_upsert_provider.cli.context import Context

    def no_spark(self):
        raise AssertionError("init started Spark to parse a plain --schema")

    monkeypatch.setattr(Context, "spark", no_spark)
    code, out, err = init(capsys, env, "--schema", SAMPLE_SCHEMA_DDL)
    assert code == 0, err
    fields = json.loads(json.loads(out)["config"]["schema"])["fields"]
    assert [f["name"] for f in fields] == ["id", "name", "amount", "updated_at", "deleted"]


def test_run_status_read_round_trip(spark, env, capsys, tmp_path):
    assert init(capsys, env, "--schema", SAMPLE_SCHEMA_DDL)[0] == 0
    code, out, _ = run(capsys, "run-batch", "orders", "--until-caught-up", "--json", "--writer-id", "me")
    assert code == 0
    report = json.loads(out)
    assert report["upper"] == 3 and report["writer_id"] == "me"
    first = report["batches"][0]
    assert {"ts", "outcome", "rows_in", "rows_out", "rejected", "seconds"} <= set(first)
    assert [b["outcome"] for b in report["batches"]] == ["committed"] * 3 + ["nothing_to_do"]
    assert sum(b["rows_in"] for b in report["batches"]) == 1998  # 6 segments x 333

    code, out, _ = run(capsys, "status", "orders", "--json")
    status = json.loads(out)
    expected = oracle_table(str(env))
    assert (status["shard"], status["upper"], status["since"], status["seqno"]) == ("orders", 3, 0, 3)
    assert status["rows"] == len(expected)
    assert status["source"]["high_watermark"] == {"p0": 21, "p1": 21}
    assert status["source"]["bound"] == {"p0": 21, "p1": 21}
    assert status["source"]["lag_offsets"] == {"p0": 0, "p1": 0}

    code, out, _ = run(capsys, "read", "orders")
    lines = [json.loads(line) for line in out.splitlines()]
    assert [r["id"] for r in lines] == sorted(k[0] for k in expected)
    assert {(r["id"],): r for r in lines} == expected

    out_path = tmp_path / "t.csv"
    assert run(capsys, "read", "orders", "--as-of", "1", "--format", "csv", "--out", str(out_path))[0] == 0
    with open(out_path) as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == ["id", "name", "amount", "updated_at"]
    as_of_1 = oracle_table(str(env), max_offset={"p0": 1, "p1": 1})
    assert [int(r["id"]) for r in rows] == sorted(k[0] for k in as_of_1)


def test_human_output_of_run_batch(spark, env, capsys):
    init(capsys, env)
    code, out, _ = run(capsys, "run-batch", "orders", "--max-batches", "2")
    assert code == 0
    assert "batch ts=0 committed" in out and "batch ts=1 committed" in out
    assert out.strip().endswith("upper: 2 (2 committed, 2 step(s))")


def test_exit_codes(spark, env, capsys, tmp_path):
    code, _, err = run(capsys, "status", "nope", "--no-rows")
    assert code == 2 and "unknown shard 'nope'" in err
    code, _, err = run(capsys, "init", "x", "--source", f"dir:{tmp_path / 'missing'}", "--key", "id")
    assert code == 2 and "does not exist" in err
    code, _, err = run(capsys, "--consensus", "mysql://h/db", "status", "x")
    assert code == 2 and "unsupported consensus backend" in err
    with pytest.raises(SystemExit) as usage:
        cli.main(["run-batch"])
    assert usage.value.code == 2
    capsys.readouterr()

    init(capsys, env)
    write_segment(str(env / "p0" / "0.jsonl"), ['{"id": 1, "amount": "lots"}'])  # replaces segment 0
    code, out, err = run(capsys, "run-batch", "orders", "--json")
    assert code == 3
    error = json.loads(out)
    assert error["error"] == "BadInputError" and error["records"][0]["line"] == 1
    assert "0.jsonl line 1: field 'amount': expected double, got lots" in err
    assert json.loads(run(capsys, "status", "orders", "--json", "--no-rows")[1])["upper"] == 0
    code, out, _ = run(capsys, "run-batch", "orders", "--json", "--on-bad-record", "quarantine")
    assert code == 0 and json.loads(out)["batches"][0]["rejected"] == 1


def test_conf_sets_the_spark_settings_of_the_commands_session(spark, env, capsys):
    init(capsys, env)
    before = spark.conf.get("spark.sql.shuffle.partitions")
    try:
        code, out, err = run(capsys, "run-batch", "orders", "--conf", "spark.sql.shuffle.partitions=3", "--json")
        assert code == 0, err
        assert json.loads(out)["batches"][0]["outcome"] == "committed"
        # A setting Spark takes at runtime is set on the session the batch ran in.
        assert spark.conf.get("spark.sql.shuffle.partitions") == "3"
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", before)
    upper = json.loads(run(capsys, "status", "orders", "--no-rows", "--json")[1])["upper"]

    # Malformed: a usage error naming the option, and nothing ran.
    code, out, err = run(capsys, "run-batch", "orders", "--conf", "spark.sql.shuffle.partitions", "--json")
    assert code == 2 and json.loads(out)["field"] == "conf"
    assert "--conf takes KEY=VALUE, not 'spark.sql.shuffle.partitions'" in err
    # A setting Spark fixes when a session starts, with another value than the running one:
    # refused, naming the key (not the value).
    code, _, err = run(capsys, "run-batch", "orders", "--conf", "spark.driver.memory=123m")
    assert code == 2 and "spark.driver.memory" in err and "123m" not in err
    assert json.loads(run(capsys, "status", "orders", "--no-rows", "--json")[1])["upper"] == upper

    # A command that starts no Spark session takes no Spark settings.
    with pytest.raises(SystemExit) as usage:
        cli.main(["gc", "orders", "--conf", "spark.sql.shuffle.partitions=3"])
    assert usage.value.code == 2
    assert "unrecognized arguments: --conf" in capsys.readouterr().err
