"""The driver JVM's memory setting, checked before a JVM or a Connect server starts with it."""

from __future__ import annotations

import re

from airflow_upsert_provider.engine.errors import ConfigurationError

# What the JVM takes after -Xmx, which is where Spark's launcher puts spark.driver.memory.
_JVM_SIZE = re.compile(r"^[0-9]+[kKmMgGtT]?$")


def check_driver_memory(value: str, option: str = "spark.driver.memory") -> str:
    """``value`` if a driver JVM can start with it as ``-Xmx`` (``2g``, ``1536m``); else a
    :class:`ConfigurationError` naming ``option`` (the JVM would exit at once, leaving PySpark
    to say only that its gateway exited)."""
    if not isinstance(value, str) or not _JVM_SIZE.match(value.strip()):
        details = {"field": "spark_conf", "key": option} if option.startswith("spark.") else {"field": option}
        raise ConfigurationError(
            f"{option} is not a memory size the driver JVM takes: a number with an optional unit "
            "k, m, g or t (e.g. 2g, 1536m)",
            **details,
        )
    return value.strip()
