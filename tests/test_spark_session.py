"""The engine's SparkSession: a conflicting request is an error, not ignored (issue 7 item 8),
and a CLI run that starts Spark prints nothing on stderr but its own lines (item 15)."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import threading

import pytest

from airflow_upsert_provider.engine.spark import session as spark_module
from airflow_upsert_provider.engine.errors import ConfigurationError
from airflow_upsert_provider.engine.spark.session import get_spark
from airflow_upsert_provider.sample_data import SAMPLE_SCHEMA_DDL, SampleSpec, generate
from tests.conftest import cli_env


def test_active_session_with_another_cluster_master_is_refused(spark):
    with pytest.raises(ConfigurationError, match=r"already active .* cannot run on 'spark://127.0.0.1:7077'"):
        get_spark("spark://127.0.0.1:7077")


def test_active_local_session_serves_another_local_master(spark):
    assert get_spark("local[1]") is spark
    assert get_spark() is spark


def test_runtime_sql_conf_is_applied_to_the_active_session(spark):
    before = spark.conf.get("spark.sql.shuffle.partitions")
    try:
        assert get_spark(conf={"spark.sql.shuffle.partitions": "3"}) is spark
        assert spark.conf.get("spark.sql.shuffle.partitions") == "3"
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", before)


def test_static_conf_that_differs_is_refused_naming_the_key_not_the_value(spark):
    assert get_spark(conf={"spark.driver.memory": spark.conf.get("spark.driver.memory")}) is spark
    with pytest.raises(ConfigurationError) as info:
        get_spark(conf={"spark.driver.memory": "7g", "spark.executor.cores": "secret-ish-value"})
    assert "spark.driver.memory" in info.value.message and "spark.executor.cores" in info.value.message
    assert "secret-ish-value" not in info.value.message


def test_a_bad_value_for_a_runtime_setting_of_the_active_session_is_named(spark):
    before = spark.conf.get("spark.sql.shuffle.partitions")
    with pytest.raises(ConfigurationError) as info:
        get_spark(conf={"spark.sql.shuffle.partitions": "abc"})
    assert info.value.exit_code == 2 and info.value.details["key"] == "spark.sql.shuffle.partitions"
    assert "spark.sql.shuffle.partitions" in info.value.message and "'abc'" not in info.value.message
    assert spark.conf.get("spark.sql.shuffle.partitions") == before


def test_a_refused_value_is_never_shown_in_the_message():
    quoted = spark_module.refused_setting(
        "spark.sql.shuffle.partitions", "a", "The value 'a' in the config \"spark.sql.shuffle.partitions\" is invalid.")
    assert quoted.message.endswith("The value <value> in the config \"spark.sql.shuffle.partitions\" is invalid.")
    bare = spark_module.refused_setting("spark.hadoop.x.secret", "hunter22", "cannot use hunter22 here")
    assert "hunter22" not in bare.message and bare.details == {"field": "spark_conf", "key": "spark.hadoop.x.secret"}


@pytest.mark.parametrize("value", ["1z", "2gb", "-1g", "", "1.5g"])
def test_a_driver_memory_the_jvm_cannot_take_is_named_before_a_jvm_starts(value):
    with pytest.raises(ConfigurationError, match="spark.driver.memory") as info:
        spark_module.check_driver_memory(value)
    assert info.value.details == {"field": "spark_conf", "key": "spark.driver.memory"}
    assert spark_module.check_driver_memory(" 1536m ") == "1536m"


def test_bad_conf_values_exit_2_naming_the_key_in_a_fresh_process(tmp_path):
    """A new session (its own driver JVM) with a value Spark refuses, and a driver memory the
    JVM would refuse: exit 2, the key named, the value not shown."""
    landing = tmp_path / "landing"
    generate(str(landing), SampleSpec(records=10, keys=5, partitions=1, segments_per_partition=1, seed=3))
    env = cli_env(f"sqlite:///{tmp_path / 'c.db'}", str(tmp_path / "blob"))
    upsertctl = [sys.executable, "-m", "airflow_upsert_provider.cli"]
    init = [*upsertctl, "init", "s", "--source", f"dir:{landing}", "--key", "id", "--schema", SAMPLE_SCHEMA_DDL]
    # init parses a plain schema without Spark; the batch is what starts the session.
    assert subprocess.run(init, env=env, capture_output=True, text=True, timeout=300).returncode == 0
    batch = [*upsertctl, "run-batch", "s", "--json"]
    for key, value in (("spark.sql.shuffle.partitions", "abc"), ("spark.driver.memory", "1z")):
        done = subprocess.run([*batch, "--conf", f"{key}={value}"], env=env, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 2, done.stderr[-2000:]
        out = json.loads(done.stdout)
        assert out["error"] == "ConfigurationError" and (out["field"], out["key"]) == ("spark_conf", key), out
        assert key in out["message"] and value not in out["message"], out
        assert "unexpected error" not in done.stderr and "JAVA_GATEWAY_EXITED" not in done.stderr


def test_jvm_stderr_filter_drops_only_the_notices(capfd):
    read_end, write_end = os.pipe()
    reader = os.fdopen(read_end, "rb", buffering=0)
    forward = threading.Thread(target=spark_module._forward_stderr, args=(reader,))
    forward.start()
    os.write(write_end, b"WARNING: Using incubator modules: jdk.incubator.vector\n"
                        b"25/11/23 ERROR Executor: a real error\n"
                        b"WARNING: Using incubator modules: jdk.incubator.vector, and more\n")
    os.close(write_end)
    forward.join(timeout=10)
    err = capfd.readouterr().err
    assert err == ("25/11/23 ERROR Executor: a real error\n"
                   "WARNING: Using incubator modules: jdk.incubator.vector, and more\n")


def test_cli_runs_that_start_spark_print_only_their_own_lines(tmp_path):
    landing = tmp_path / "landing"
    generate(str(landing), SampleSpec(records=100, keys=20, partitions=1, segments_per_partition=1, seed=3))
    env = cli_env(f"sqlite:///{tmp_path / 'c.db'}", str(tmp_path / "blob"))
    env.pop("UPSERT_SPARK_LOG_LEVEL", None)
    upsertctl = [sys.executable, "-m", "airflow_upsert_provider.cli"]
    init = subprocess.run(upsertctl + ["init", "s", "--source", f"dir:{landing}", "--key", "id", "--schema",
                                       SAMPLE_SCHEMA_DDL, "--json"], env=env, capture_output=True, text=True)
    assert init.returncode == 0 and init.stderr == "", init.stderr
    # Piped (not a terminal): progress goes to stdout, stderr stays empty.
    batch = subprocess.run(upsertctl + ["run-batch", "s"], env=env, capture_output=True, text=True)
    assert batch.returncode == 0 and batch.stderr == "", batch.stderr
    assert "batch ts=0 committed" in batch.stdout
    # An error is the CLI's own line, still on stderr.
    missing = subprocess.run(upsertctl + ["read", "s", "--out", "/nonexistent/x"], env=env, capture_output=True, text=True)
    assert missing.returncode == 2
    assert missing.stderr == "upsertctl: cannot write --out /nonexistent/x: No such file or directory\n"


def test_a_full_disk_is_one_line_on_stderr_not_spark_stack_traces(tmp_path, tmpfs):
    """Spark's own reports of a failed task (the whole stack, several times) are dropped: the
    failure reaches the engine as an exception and becomes one clear line."""
    root = tmpfs("256k")
    landing = tmp_path / "landing"
    generate(str(landing), SampleSpec(records=20000, keys=20000, partitions=1, segments_per_partition=1, seed=1))
    env = cli_env(f"sqlite:///{tmp_path / 'c.db'}", str(root))
    upsertctl = [sys.executable, "-m", "airflow_upsert_provider.cli"]
    init = subprocess.run(upsertctl + ["init", "s", "--source", f"dir:{landing}", "--key", "id", "--schema",
                                       SAMPLE_SCHEMA_DDL], env=env, capture_output=True, text=True)
    assert init.returncode == 0, init.stderr
    batch = subprocess.run(upsertctl + ["run-batch", "s"], env=env, capture_output=True, text=True)
    assert batch.returncode == 2
    assert batch.stderr.count("\n") == 1 and batch.stderr.startswith("upsertctl: writing batch 0"), batch.stderr
    assert "No space left on device" in batch.stderr


def _jvm_option(spark, name: str) -> str:
    """The value of a HotSpot option in the session's driver JVM."""
    jvm = spark.sparkContext._jvm
    bean_class = jvm.java.lang.Class.forName("com.sun.management.HotSpotDiagnosticMXBean")
    return jvm.java.lang.management.ManagementFactory.getPlatformMXBean(bean_class).getVMOption(name).getValue()


def run_probe(probe: str, without: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """``probe`` in a fresh interpreter with a local session of its own, the variables
    ``without`` names left out of its environment; it must exit 0."""
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1")
    for name in ("UPSERT_SPARK_REMOTE", *without):
        env.pop(name, None)
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_a_new_local_session_runs_its_driver_jvm_with_the_engine_options_and_none_of_the_output_streams():
    """One fresh process with a local session of its own (without the C1-only setting the suite
    gives its own JVMs, tests/conftest.py):
    - the engine's log4j configuration, then its own JVM options, on the driver JVM; the JIT
      keeps its default tiers (C1 only would slow warm work, docs/performance.md);
    - what the JVM prints on its stdout reaches the process's stderr, never its stdout (an
      `upsertctl --json` result stays valid), and the JVM holds neither of the process's own
      output streams, so a reader of them is done when the process exits, not when the JVM
      has shut down."""
    probe = (
        "import json, os\n"
        "from airflow_upsert_provider.engine.spark.session import get_spark\n"
        "from tests.test_spark_session import _jvm_option\n"
        "spark = get_spark('local[1]')\n"
        "jvm = spark.sparkContext._jvm\n"
        "arguments = list(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())\n"
        "tiered = _jvm_option(spark, 'TieredStopAtLevel')\n"
        "jvm.java.lang.System.out.println('jvm-stdout-marker')\n"
        "jvm.java.lang.System.out.flush()\n"
        "pid = int(jvm.java.lang.ProcessHandle.current().pid())\n"
        "mine = {os.readlink(f'/proc/self/fd/{fd}') for fd in (1, 2)}\n"
        "held = {os.readlink(f'/proc/{pid}/fd/{fd}') for fd in (1, 2)}\n"
        "print(json.dumps({'arguments': arguments, 'tiered': tiered, 'mine': sorted(mine), 'jvm': sorted(held)}),"
        " flush=True)\n"
        # The marker crosses a pipe and a forwarding thread: let the JVM exit (its stdin
        # closed), then join the thread, which ends at the pipe's EOF, so the marker has been
        # forwarded however slowly the machine runs.
        "import threading\n"
        "from pyspark import SparkContext\n"
        "spark.stop()\n"
        "proc = SparkContext._gateway.proc\n"
        "proc.stdin.close()\n"
        "proc.wait(timeout=240)\n"
        "[t.join(timeout=240) for t in threading.enumerate() if t.name == 'spark-driver-stderr']\n"
    )
    # Importing tests.conftest (through this module) would set the variable again.
    probe = probe.replace("from tests.test_spark_session import _jvm_option\n", inspect.getsource(_jvm_option))
    done = run_probe(probe, without=("SPARK_SUBMIT_OPTS",))
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert f"-Dlog4j.configurationFile=file:{spark_module.LOG4J_CONFIG}" in seen["arguments"]
    assert all(option in seen["arguments"] for option in spark_module.DRIVER_JAVA_OPTIONS)
    assert seen["tiered"] == "4"
    assert "jvm-stdout-marker" in done.stderr and "jvm-stdout-marker" not in done.stdout
    assert not set(seen["mine"]) & set(seen["jvm"]), seen


def test_a_users_driver_java_options_replace_the_engines():
    probe = (
        "import json\n"
        "from airflow_upsert_provider.engine.spark.session import get_spark\n"
        "from tests.test_spark_session import _jvm_option\n"
        "spark = get_spark('local[1]', conf={'spark.driver.extraJavaOptions': '-Dupsert.probe=1 "
        "-XX:TieredStopAtLevel=1'})\n"
        "jvm = spark.sparkContext._jvm\n"
        "print(json.dumps({'arguments': list(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()"
        ".getInputArguments()), 'tiered': _jvm_option(spark, 'TieredStopAtLevel')}))\n"
        "spark.stop()\n"
    )
    done = run_probe(probe)
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert "-Dupsert.probe=1" in seen["arguments"] and seen["tiered"] == "1"
    assert not any(a.startswith("-Dlog4j.configurationFile=") for a in seen["arguments"])


def test_a_job_directory_hadoop_could_not_create_is_not_a_raw_line_on_stderr(spark, tmp_path, capfd):
    """Hadoop's FileOutputCommitter only logs ``ERROR ... Mkdirs failed to create`` (GC deleted a
    staging directory under a writer: note M2); the engine reports what fails next."""
    import time

    jvm = spark.sparkContext._jvm
    log_manager = jvm.org.apache.logging.log4j.LogManager
    # What FileOutputCommitter.setupJob logs when mkdirs returns false (a directory removed
    # under it; as root, no permission makes mkdirs fail here), through the same logger.
    committer_log = log_manager.getLogger("org.apache.hadoop.mapreduce.lib.output.FileOutputCommitter")
    committer_log.error(f"Mkdirs failed to create file:{tmp_path}/s/runs/ts=000000000003/w-1/_temporary/0")
    # Another error line after it, which the filter lets through: once it is on stderr, so is
    # everything logged before it (one forwarding thread, in order).
    log_manager.getLogger("upsert.test").error("marker after the committer")
    seen, deadline = "", time.monotonic() + 60
    while "marker after the committer" not in seen and time.monotonic() < deadline:
        time.sleep(0.05)
        seen += capfd.readouterr().err
    assert "marker after the committer" in seen
    assert "Mkdirs failed" not in seen, seen
