"""A task's metrics through the backend Airflow's ``[metrics]`` configures (StatsD, DogStatsD
or OpenTelemetry; docs/metrics.md).

What is sent is decided in engine/common/metrics.py; this is the sink. It builds the backend
the way Airflow's task runner does (``stats_utils.get_stats_factory``), so names get Airflow's
``statsd_prefix``, tags follow ``statsd_influxdb_enabled`` / ``statsd_datadog_enabled`` / OTel
attributes, and the allow and block lists apply. With ``statsd_on``, ``statsd_datadog_enabled``
and ``otel_on`` all off there is no sink: nothing is built and nothing is sent.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from airflow_upsert_provider.engine.common import metrics
from airflow_upsert_provider.engine.errors import first_line


class AirflowStatsSink:
    """Metrics through an Airflow stats backend (``SafeStatsdLogger`` and its kin)."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend

    def send(self, batch: Sequence[metrics.Metric]) -> None:
        for metric in batch:
            if metric.kind == metrics.COUNT:
                self.backend.incr(metric.name, int(metric.value), tags=metric.tags)
            elif metric.kind == metrics.TIMING:
                self.backend.timing(metric.name, metric.value, tags=metric.tags)
            else:
                self.backend.gauge(metric.name, metric.value, tags=metric.tags)


def metrics_on() -> bool:
    """Whether ``[metrics]`` sends anywhere."""
    from airflow.sdk.configuration import conf

    return any(conf.getboolean("metrics", option, fallback=False)
               for option in ("statsd_on", "statsd_datadog_enabled", "otel_on"))


@functools.cache
def airflow_sink() -> AirflowStatsSink | None:
    """This process's sink (one backend, one socket), or None when metrics are off."""
    if not metrics_on():
        return None
    from airflow.sdk.observability.metrics.stats_utils import get_stats_factory

    return AirflowStatsSink(get_stats_factory()())


def send(build: Callable[[], Iterable[metrics.Metric]]) -> None:
    """Send what ``build()`` returns, built only when metrics are on. Never raises: a task's
    outcome does not depend on its metrics."""
    try:
        sink = airflow_sink()
        if sink is not None:
            metrics.send_quietly(sink, build())
    except Exception as exc:  # noqa: BLE001 - a misconfigured backend or a bad value never fails a task
        metrics.log.warning("metrics not sent (%s: %s)", type(exc).__name__, first_line(exc))
