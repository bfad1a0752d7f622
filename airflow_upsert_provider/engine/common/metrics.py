"""What a shard reports to a metrics system: names, values and tags (docs/metrics.md).

Pure: each function turns a result the engine already produced (a batch result's dict, a
maintenance step's duration, the live runs, a frontier evaluation's dict) into
:class:`Metric` values. Sending them is a sink's job (:class:`MetricSink`): the StatsD client
of ``upsertctl --statsd`` (cli/metrics.py), Airflow's own stats in a task
(airflow_upsert_provider/metrics.py). Results are taken as mappings, so that this lowest
layer needs none of the layers that build them.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple, Protocol

from airflow_upsert_provider.engine.errors import first_line

log = logging.getLogger(__name__)

PREFIX = "upsert"

# Kinds, as StatsD types them: a gauge holds the last value, a count adds up, a timing (ms) is
# summarised (percentiles) by the collector.
GAUGE = "gauge"
COUNT = "count"
TIMING = "timing"
KINDS = (GAUGE, COUNT, TIMING)

# The outcome a batch reports when its commit's outcome is unknown (the writer raised
# OutcomeUnknown: exit 5, safe to retry); the writer's own words for the others.
OUTCOME_UNKNOWN = "outcome_unknown"

MAINTENANCE_OPERATIONS = ("compact", "checkpoint", "gc", "publish")

# The frontier statuses (engine/frontier/model.py FrontierStatus) as numbers, so that one gauge
# holds the current one (a gauge per status would keep an old status at 1 in the collector).
# Higher is worse for the first five; STOPPED, RECOVERING and NOT_FOUND are states an operator
# chose or a missing shard, kept apart at the top.
FRONTIER_STATUS_CODES: dict[str, int] = {
    "OK": 0,
    "IDLE": 1,
    "LAGGING": 2,
    "STALLED": 3,
    "REWOUND": 4,
    "STALE": 5,
    "RECOVERING": 6,
    "STOPPED": 7,
    "NOT_FOUND": 8,
}

# What a tag value may hold: StatsD's line and the InfluxDB tag syntax reserve ',', '=', ':',
# '|', '#' and whitespace. Anything else becomes '_' (shard ids never need it).
_TAG_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-/]")


class Metric(NamedTuple):
    """One value to send: ``name`` (without the sink's prefix), ``value``, ``tags``, ``kind``."""

    name: str
    value: float
    tags: dict[str, str]
    kind: str = GAUGE


class MetricSink(Protocol):
    """Where metrics go. ``send`` may raise; :func:`send_quietly` is how the engine calls it."""

    def send(self, metrics: Sequence[Metric]) -> None: ...


def send_quietly(sink: MetricSink | None, metrics: Iterable[Metric]) -> None:
    """Send ``metrics`` to ``sink`` (None: metrics are off, nothing is built or sent). A
    failure is logged, never raised: what a batch or a maintenance step did does not depend
    on its metrics."""
    if sink is None:
        return
    batch = list(metrics)
    if not batch:
        return
    try:
        sink.send(batch)
    except Exception as exc:  # noqa: BLE001 - a metrics system that is down never fails a step
        log.warning("metrics not sent (%s: %s)", type(exc).__name__, first_line(exc))


def tag_value(value: Any) -> str:
    """``value`` as a tag value every StatsD dialect accepts."""
    return _TAG_UNSAFE.sub("_", str(value)) or "_"


def _tags(shard: str, **more: Any) -> dict[str, str]:
    return {"shard": tag_value(shard), **{k: tag_value(v) for k, v in more.items() if v is not None}}


def _name(*parts: str) -> str:
    return ".".join((PREFIX, *parts))


def batch_metrics(shard: str, result: Mapping[str, Any]) -> list[Metric]:
    """A batch step's metrics from its result (``BatchResult.to_dict()``): its outcome, duration,
    rows, rejects and bytes written (a committed step only), then the lag after it. A step
    that found nothing to do reports its outcome and the lag only."""
    outcome = str(result["outcome"])
    tags = _tags(shard)
    out = [
        Metric(_name("batch", "outcome"), 1, _tags(shard, outcome=outcome), COUNT),
        Metric(_name("batch", "duration"), round(float(result.get("seconds") or 0.0) * 1000.0, 3),
               _tags(shard, outcome=outcome), TIMING),
    ]
    if outcome != "nothing_to_do":
        for key, name in (("rows_in", "rows_in"), ("rows_out", "rows_out"), ("rejected", "rejects"),
                          ("bytes_written", "bytes_written")):
            out.append(Metric(_name("batch", name), int(result.get(key) or 0), tags, COUNT))
    if result.get("upper") is not None and outcome != OUTCOME_UNKNOWN:
        out.append(Metric(_name("upper"), int(result["upper"]), tags))
    out.extend(lag_metrics(shard, result.get("lag"), result.get("lag_unit"), result.get("lag_seconds")))
    return out


def outcome_unknown_metrics(shard: str, seconds: float) -> list[Metric]:
    """A batch whose commit's outcome is unknown: it is counted, with its duration."""
    return batch_metrics(shard, {"outcome": OUTCOME_UNKNOWN, "seconds": seconds, "upper": None})


def lag_metrics(shard: str, lag: int | None, unit: str | None, lag_seconds: float | None) -> list[Metric]:
    """The lag in the source's unit (tag ``unit``) and in seconds. Not measured (None): not
    sent. Nothing pending is 0 seconds; pending without a landing time (a Kafka source) sends
    the unit's figure only."""
    if lag is None:
        return []
    out = [Metric(_name("lag"), int(lag), _tags(shard, unit=unit or "unknown"))]
    if lag_seconds is not None:
        out.append(Metric(_name("lag_seconds"), round(float(lag_seconds), 3), _tags(shard)))
    elif int(lag) == 0:
        out.append(Metric(_name("lag_seconds"), 0, _tags(shard)))
    return out


def maintenance_metrics(shard: str, operation: str, seconds: float, *, outcome: str | None = None) -> list[Metric]:
    """A maintenance step's duration (compact, checkpoint, gc, publish)."""
    if operation not in MAINTENANCE_OPERATIONS:
        raise ValueError(f"unknown maintenance operation {operation!r}: one of {', '.join(MAINTENANCE_OPERATIONS)}")
    return [Metric(_name(operation, "duration"), round(float(seconds) * 1000.0, 3),
                   _tags(shard, outcome=outcome), TIMING)]


def live_runs_metrics(shard: str, live_runs: int) -> list[Metric]:
    """The runs a read of the shard merges now (the compacted runs and the batches above since)."""
    return [Metric(_name("live_runs"), int(live_runs), _tags(shard))]


def frontier_metrics(evaluation: Mapping[str, Any]) -> list[Metric]:
    """A frontier evaluation's status (as its code, tagged with its name), whether it pages,
    how long the upper has been stuck, and the lag the monitor measured
    (``Evaluation.to_dict()``)."""
    shard = str(evaluation["shard_id"])
    status = str(evaluation["status"])
    if status not in FRONTIER_STATUS_CODES:
        raise ValueError(f"unknown frontier status {status!r} of shard {shard!r}")
    out = [
        Metric(_name("frontier", "status"), FRONTIER_STATUS_CODES[status], _tags(shard, status=status)),
        Metric(_name("frontier", "breach"), 1 if evaluation.get("breach") else 0, _tags(shard)),
    ]
    if evaluation.get("stuck_seconds") is not None:
        out.append(Metric(_name("frontier", "stuck_seconds"), round(float(evaluation["stuck_seconds"]), 3),
                          _tags(shard)))
    if evaluation.get("upper") is not None:
        out.append(Metric(_name("upper"), int(evaluation["upper"]), _tags(shard)))
    out.extend(lag_metrics(shard, evaluation.get("lag"), evaluation.get("lag_unit"), evaluation.get("lag_seconds")))
    return out


def influx_name(metric: Metric) -> str:
    """``name,tag=value,...``: the name with its tags as InfluxDB's StatsD dialect (and
    Telegraf's statsd input) reads them, tags sorted; what Airflow sends under
    ``[metrics] statsd_influxdb_enabled``."""
    return ",".join([metric.name, *(f"{k}={v}" for k, v in sorted(metric.tags.items()))])
