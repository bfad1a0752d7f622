"""The SparkSession the engine runs on, kept on loopback for local masters."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Mapping

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DEFAULT_MASTER = "local[*]"
LOG4J_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "log4j2.properties")
# Sane defaults for micro-batches on a small machine; a connection or --conf overrides them.
DEFAULT_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "8",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.sources.partitionOverwriteMode": "static",
    "spark.driver.memory": "2g",
}


def is_local_master(master: str) -> bool:
    return master.startswith("local")


def get_spark(
    master: str | None = None,
    app_name: str = "airflow-upsert-provider",
    conf: Mapping[str, str] | None = None,
) -> "SparkSession":
    """The active SparkSession, or a new one on ``master`` (default ``local[*]``).

    Local sessions bind the driver to 127.0.0.1: Spark otherwise picks a non-loopback
    address when the hostname resolves to loopback.
    """
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    master = master or os.environ.get("UPSERT_SPARK_MASTER", DEFAULT_MASTER)
    builder = SparkSession.builder.master(master).appName(app_name)
    settings = dict(DEFAULT_CONF)
    if is_local_master(master) or os.environ.get("SPARK_LOCAL_IP") == "127.0.0.1":
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        settings["spark.driver.host"] = "127.0.0.1"
        settings["spark.driver.bindAddress"] = "127.0.0.1"
    if "spark.driver.extraJavaOptions" not in (conf or {}):
        # Only takes effect when this call launches the driver JVM (the usual case).
        settings["spark.driver.extraJavaOptions"] = f"-Dlog4j.configurationFile=file:{LOG4J_CONFIG}"
    settings.update(conf or {})
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(os.environ.get("UPSERT_SPARK_LOG_LEVEL", "ERROR"))
    return spark
