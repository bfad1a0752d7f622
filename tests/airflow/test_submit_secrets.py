"""Submit mode keeps the consensus password out of every argument list and log line.

The Spark provider turns ``env_vars`` into ``--conf spark.yarn.appMasterEnv.*`` and
``spark.kubernetes.driverEnv.*`` arguments on YARN and Kubernetes masters, where ``ps`` shows
them to every user. The operator therefore hands the job its consensus URL in a file readable
only by the task's user, and removes it afterwards.

A recording ``spark-submit`` (first on PATH) keeps what the provider really ran: its argument
list (what ``ps`` shows), its environment and the credentials file it was pointed at. On a
local master it then runs the real ``spark-submit``, so the job is shown to read the file.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import sys
import textwrap

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from airflow_upsert_provider.operators.upsert import MicroBatchUpsertOperator
from airflow_upsert_provider.sample_data import SampleSpec, generate
from tests.airflow.conftest import VENV_BIN, init_shard

pytestmark = pytest.mark.slow

PASSWORD = "s3cret-pw"

RECORDER = textwrap.dedent(
    """\
    #!{python}
    import json, os, stat, sys
    argv = sys.argv[1:]
    url_file = argv[argv.index("--consensus-url-file") + 1] if "--consensus-url-file" in argv else None
    record = {{"argv": argv, "env": dict(os.environ), "url_file": url_file}}
    if url_file:
        info = os.stat(url_file)
        record["mode"] = stat.S_IMODE(info.st_mode)
        record["dir_mode"] = stat.S_IMODE(os.stat(os.path.dirname(url_file)).st_mode)
        record["owner_is_me"] = info.st_uid == os.getuid()
        with open(url_file) as handle:
            record["url"] = handle.read()
    with open(os.environ["SUBMIT_RECORD"], "w") as handle:
        json.dump(record, handle)
    master = argv[argv.index("--master") + 1]
    if master.startswith("local"):
        os.execv({real!r}, [{real!r}, *argv])
    print("recording spark-submit: not a cluster here")
    sys.exit(1)
    """
)


class TaskInstance:
    dag_id, run_id, task_id, map_index, try_number = "upsert_microbatch", "manual__1", "upsert", -1, 1


def install_recorder(tmp_path, monkeypatch):
    """Put a recording spark-submit first on PATH; return the file its record lands in."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "spark-submit"
    script.write_text(RECORDER.format(python=sys.executable, real=os.path.join(VENV_BIN, "spark-submit")))
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    record = tmp_path / "record.json"
    monkeypatch.setenv("SUBMIT_RECORD", str(record))
    return record


@pytest.fixture
def recorder(tmp_path, monkeypatch):
    record = install_recorder(tmp_path, monkeypatch)
    # Nothing secret may come from the worker's own environment either.
    monkeypatch.delenv("UPSERT_CONSENSUS_URL", raising=False)
    return lambda: json.loads(record.read_text())


@pytest.fixture
def store(pg_url, tmp_path, monkeypatch):
    assert f":{PASSWORD}@" in pg_url
    landing = str(tmp_path / "landing")
    generate(landing, SampleSpec(records=300, keys=60, partitions=1, segments_per_partition=2, seed=5))
    blob = str(tmp_path / "blob")
    init_shard(pg_url, blob, landing, max_files_per_batch=2)
    user_url = pg_url.replace(f":{PASSWORD}@", "@")
    monkeypatch.setenv("AIRFLOW_CONN_UPSERT_DEFAULT", json.dumps(
        {"conn_type": "upsert", "password": PASSWORD, "extra": {"consensus_url": user_url, "blob_root": blob}}
    ))
    return pg_url


def _spark_connection(monkeypatch, connection: dict) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps(connection))


def _assert_no_password(record: dict, *texts: str) -> None:
    assert all(PASSWORD not in arg for arg in record["argv"])
    # The worker's own environment (here: the test's AIRFLOW_CONN_* connections) is inherited
    # as it is; the operator adds nothing secret to it.
    added = {k: v for k, v in record["env"].items() if not k.startswith("AIRFLOW_CONN_")}
    assert not any(PASSWORD in value for value in added.values())
    for text in texts:
        assert PASSWORD not in text


def _assert_private_file(record: dict, pg_url: str) -> None:
    from sqlalchemy.engine import make_url

    # The job got the whole URL, password included (the driver name may be spelled out).
    given, expected = make_url(record["url"]), make_url(pg_url)
    assert (given.password, given.host, given.port, given.database) == (
        PASSWORD, expected.host, expected.port, expected.database)
    assert record["mode"] == 0o600 and record["dir_mode"] == 0o700 and record["owner_is_me"]
    # Removed once the job ended.
    assert not os.path.exists(record["url_file"])
    assert not os.path.exists(os.path.dirname(record["url_file"]))


CLUSTERS = {
    "yarn": ({"conn_type": "spark", "host": "yarn", "extra": {"queue": "etl", "deploy-mode": "cluster"}},
             "spark.yarn.appMasterEnv.PYSPARK_PYTHON="),
    "kubernetes": ({"conn_type": "spark", "host": "k8s://https://127.0.0.1", "port": 6443,
                    "extra": {"namespace": "etl"}},
                   "spark.kubernetes.driverEnv.PYSPARK_PYTHON="),
    "standalone": ({"conn_type": "spark", "host": "spark://127.0.0.1", "port": 7077}, None),
}


@pytest.mark.parametrize("cluster", sorted(CLUSTERS))
def test_cluster_masters_get_no_password_in_arguments_environment_or_logs(
    cluster, recorder, store, monkeypatch, caplog, capfd
):
    connection, env_conf = CLUSTERS[cluster]
    _spark_connection(monkeypatch, connection)
    if cluster == "kubernetes":
        # The Spark provider refuses k8s:// masters unless the Kubernetes provider is
        # installed; only the command line it builds matters here.
        from airflow.providers.apache.spark.hooks import spark_submit

        monkeypatch.setattr(spark_submit, "kube_client", object(), raising=False)
    caplog.set_level(logging.DEBUG)
    operator = MicroBatchUpsertOperator(task_id="upsert", shard="orders", spark_mode="submit")
    with pytest.raises(AirflowException) as raised:
        operator.execute({"ti": TaskInstance()})
    assert "the Spark job ended without a result" in str(raised.value)
    record = recorder()
    argv = record["argv"]
    master = argv[argv.index("--master") + 1]
    assert master == {"yarn": "yarn", "kubernetes": "k8s://https://127.0.0.1:6443",
                      "standalone": "spark://127.0.0.1:7077"}[cluster]
    # The driver stays beside the task (client mode) even when the connection says cluster.
    assert argv[argv.index("--deploy-mode") + 1] == "client"
    if env_conf:
        # The provider did turn env_vars into --conf arguments: the password is not among them.
        assert any(arg.startswith(env_conf) for arg in argv)
    out, err = capfd.readouterr()
    _assert_no_password(record, caplog.text, out, err, str(raised.value))
    _assert_private_file(record, store)


def test_local_submit_reads_the_credentials_file_and_removes_it(recorder, store, monkeypatch, caplog, capfd):
    _spark_connection(monkeypatch, {"conn_type": "spark", "host": "local[1]"})
    caplog.set_level(logging.DEBUG)
    operator = MicroBatchUpsertOperator(task_id="upsert", shard="orders", spark_mode="submit", until_caught_up=True)
    report = operator.execute({"ti": TaskInstance()})
    assert [b["outcome"] for b in report["batches"]] == ["committed", "nothing_to_do"]
    record = recorder()
    out, err = capfd.readouterr()
    _assert_no_password(record, caplog.text, out, err, json.dumps(report))
    _assert_private_file(record, store)


def test_cluster_deploy_mode_is_refused_before_anything_is_written(store, monkeypatch, tmp_path):
    _spark_connection(monkeypatch, {"conn_type": "spark", "host": "local[1]"})
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    os.makedirs(tmp_path / "tmp")
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    operator = MicroBatchUpsertOperator(
        task_id="upsert", shard="orders", spark_mode="submit", submit_options={"deploy_mode": "cluster"}
    )
    with pytest.raises(AirflowFailException, match="deploy_mode must be 'client', got 'cluster'"):
        operator.execute({"ti": TaskInstance()})
    # Its working directory (and the credentials file in it) is gone.
    assert os.listdir(tmp_path / "tmp") == []


def test_the_job_reads_its_url_from_the_file_and_names_only_the_path_on_failure(tmp_path):
    from airflow_upsert_provider.engine.errors import ConfigurationError
    from airflow_upsert_provider.engine.write.spark_job import consensus_url

    path = tmp_path / "url"
    path.write_text(f"postgresql://u:{PASSWORD}@h/db\n")
    assert consensus_url(str(path)) == f"postgresql://u:{PASSWORD}@h/db"
    path.write_text("")
    with pytest.raises(ConfigurationError, match="is empty"):
        consensus_url(str(path))
    with pytest.raises(ConfigurationError, match="cannot read the consensus URL file .*/missing") as raised:
        consensus_url(str(tmp_path / "missing"))
    assert stat.S_ISDIR(os.stat(tmp_path).st_mode) and PASSWORD not in str(raised.value)
