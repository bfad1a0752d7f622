"""Pure rules of the local Spark Connect server, without a JVM: the cause a failed start is
described by, read from real server.log shapes (issue 34, finding K9)."""

from __future__ import annotations

import random

import pytest

from airflow_upsert_provider.engine.spark.server import CAUSE_MAX_CHARS, startup_failure_cause

MARK = ("--- 2026-11-27T20:37:36+00:00 starting: /venv/pyspark/bin/spark-submit --class "
        "org.apache.spark.sql.connect.service.SparkConnectServer --name upsert-spark-connect --properties-file "
        "/s/spark-server/server.properties spark-internal (settings: spark.master, spark.driver.memory)\n")
NOTICE = "WARNING: Using incubator modules: jdk.incubator.vector\n"

# `spark-server start --conf spark.master=garbage`, as written by Spark 4.2.
BAD_MASTER = MARK + NOTICE + """Exception in thread "main" org.apache.spark.SparkException: Master must either be yarn or start with spark, k8s, or local
\tat org.apache.spark.deploy.SparkSubmit.error(SparkSubmit.scala:1068)
\tat org.apache.spark.deploy.SparkSubmit.prepareSubmitEnvironment(SparkSubmit.scala:263)
\tat org.apache.spark.deploy.SparkSubmit.org$apache$spark$deploy$SparkSubmit$$runMain(SparkSubmit.scala:965)
\tat org.apache.spark.deploy.SparkSubmit.doRunMain$1(SparkSubmit.scala:203)
\tat org.apache.spark.deploy.SparkSubmit.submit(SparkSubmit.scala:226)
\tat org.apache.spark.deploy.SparkSubmit.doSubmit(SparkSubmit.scala:95)
\tat org.apache.spark.deploy.SparkSubmit$$anon$2.doSubmit(SparkSubmit.scala:1171)
\tat org.apache.spark.deploy.SparkSubmit$.main(SparkSubmit.scala:1180)
\tat org.apache.spark.deploy.SparkSubmit.main(SparkSubmit.scala)
"""
# The JVM refusing its options (Java 17's own lines).
BAD_OPTION = MARK + """Unrecognized option: -Xbogus
Error: Could not create the Java Virtual Machine.
Error: A fatal exception has occurred. Program will exit.
"""
BAD_HEAP = MARK + """Invalid maximum heap size: -Xmx0
Error: Could not create the Java Virtual Machine.
Error: A fatal exception has occurred. Program will exit.
"""
NO_MEMORY = MARK + """Error occurred during initialization of VM
Could not reserve enough space for 104856551424KB object heap
"""
# A log4j ERROR line with its exception attached (the gRPC port could not be bound).
BIND_FAILED = MARK + NOTICE + """26/11/27 20:32:38 INFO SparkConnectServer: Starting Spark session.
26/11/27 20:32:51 ERROR SparkConnectServer: Error starting Spark Connect server
java.io.IOException: Failed to bind to address /127.0.0.1:15002
\tat org.sparkproject.connect.grpc.netty.NettyServer.start(NettyServer.java:328)
\tat org.apache.spark.sql.connect.service.SparkConnectService$.startGRPCService(SparkConnectService.scala:412)
Caused by: java.net.BindException: Address already in use
\tat java.base/sun.nio.ch.Net.bind0(Native Method)
\t... 12 more
"""

CASES = [
    (BAD_MASTER, "org.apache.spark.SparkException: Master must either be yarn or start with spark, k8s, or local"),
    (BAD_OPTION, "Unrecognized option: -Xbogus"),
    (BAD_HEAP, "Invalid maximum heap size: -Xmx0"),
    (NO_MEMORY, "Could not reserve enough space for 104856551424KB object heap"),
    (BIND_FAILED, "java.io.IOException: Failed to bind to address /127.0.0.1:15002"),
]


@pytest.mark.parametrize(("log", "cause"), CASES, ids=["master", "option", "heap", "memory", "bind"])
def test_a_failed_start_is_described_by_its_cause_line_not_stack_frames(log, cause):
    assert startup_failure_cause(log) == cause


def test_only_the_last_start_counts():
    """server.log keeps every start: an earlier start's failure does not describe this one."""
    assert startup_failure_cause(BAD_MASTER + BAD_OPTION) == "Unrecognized option: -Xbogus"
    assert startup_failure_cause(BAD_OPTION + BAD_MASTER).startswith("org.apache.spark.SparkException: Master")


def test_a_log_without_an_exception_gives_its_last_lines_without_frames():
    log = MARK + NOTICE + "something went wrong\n\tat a.b.C.d(C.java:1)\nthe end\n"
    assert startup_failure_cause(log) == f"{NOTICE.strip()} | something went wrong | the end"
    assert startup_failure_cause("") == "(empty log)" and startup_failure_cause(MARK) == "(empty log)"


def test_the_cause_is_never_a_stack_frame_and_is_bounded_over_mixed_logs():
    """A seeded sweep: logs made of a real failure's lines, frames and noise in any order and
    number: the cause is one of the log's lines (or the tail), never a frame, and bounded."""
    rng = random.Random(34)
    pieces = [line for log, _ in CASES for line in log.splitlines() if not line.startswith("---")]
    pieces += ["x" * 1000 + "Exception: long", "26/11/27 20:00:00 WARN Foo: careful"]
    for _ in range(500):
        lines = [rng.choice(pieces) for _ in range(rng.randint(0, 30))]
        cause = startup_failure_cause(MARK + "\n".join(lines))
        assert len(cause) <= CAUSE_MAX_CHARS
        assert not cause.startswith(("at ", "... ")), cause
        if not any(line.strip() for line in lines):
            assert cause == "(empty log)"
