"""The engine's own tests, run unchanged through a Spark Connect session (conftest.py): the
writer against its oracle, bad input, Kafka batches through the Python data source,
continuous mode (localCheckpoint, persist) and upsertctl in-process with --remote."""

from __future__ import annotations

from airflow_upsert_provider.engine.spark.session import is_connect_session

# Imported test functions are collected here and get this directory's `spark` fixture.
from tests.test_writer import (  # noqa: F401
    test_batch_ahead_of_upper_is_held_not_appended,
    test_catch_up_equals_oracle_and_every_ts_committed_once,
    test_lagging_writer_drops_persisted_batches_and_reaches_upper,
    test_read_as_of_every_ts_matches_oracle_of_bound_offsets,
)
from tests.test_bad_input import (  # noqa: F401  (the module-scoped batches they share, too)
    bad_records_failed,
    bad_records_quarantined,
    test_bad_record_fails_the_batch_naming_file_line_reason,
    test_bad_record_quarantined_is_counted_and_batch_commits,
    test_batch_whose_every_record_is_bad,
)
from tests.kafka.test_kafka_shard import (  # noqa: F401
    test_batches_equal_the_oracle_and_the_group_follows_the_upper,
)
from tests.kafka.test_kafka_cli import test_debezium_topic_through_upsertctl  # noqa: F401
from tests.kafka.test_continuous import test_continuous_run_with_prefetch_equals_the_oracle  # noqa: F401
from tests.test_run_io_spark import (  # noqa: F401  (runs written and read by the executors through pyarrow)
    test_a_compaction_reads_runs_spark_wrote_and_writes_through_the_executors,
    test_the_executors_report_what_they_wrote,
)


def test_the_session_is_a_connect_client_without_a_spark_context(spark):
    from pyspark.errors import PySparkAttributeError

    assert is_connect_session(spark)
    try:
        spark.sparkContext
    except (PySparkAttributeError, AttributeError, NotImplementedError):
        pass
    else:  # pragma: no cover
        raise AssertionError("a Connect session has no SparkContext")
