"""``upsertctl --statsd HOST:PORT`` (or ``UPSERT_STATSD``): a command's metrics to StatsD.

What is sent is decided in engine/common/metrics.py; this is the sink (the ``statsd``
package's UDP client, tags in the InfluxDB dialect Airflow sends with
``[metrics] statsd_influxdb_enabled``) and the few calls the commands make. Without the
option and the variable nothing is built and nothing is sent.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence
from typing import Any

from airflow_upsert_provider.engine.common import metrics
from airflow_upsert_provider.engine.errors import ConfigurationError, first_line

STATSD_ENV = "UPSERT_STATSD"
STATSD_PREFIX_ENV = "UPSERT_STATSD_PREFIX"

# The commands whose duration is a maintenance metric, and how a command's args name it.
MAINTENANCE_COMMANDS = {"compact": "compact", "gc": "gc", "publish": "publish"}


def parse_statsd_address(text: str, option: str = "--statsd") -> tuple[str, int]:
    """``HOST:PORT`` (``[IPV6]:PORT`` for an IPv6 address) as (host, port); anything else is
    refused naming ``option``."""
    host, sep, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigurationError(f"{option} takes HOST:PORT (a UDP port 1-65535), not {text!r}",
                                 field=option.lstrip("-"))
    return host, int(port)


def statsd_option(text: str) -> str:
    """The ``type=`` of ``--statsd``: checked before anything is opened."""
    parse_statsd_address(text)
    return text


class StatsdSink:
    """Metrics as StatsD lines over UDP, one pipeline (a few packets) per send."""

    def __init__(self, host: str, port: int, prefix: str | None = None) -> None:
        try:
            from statsd import StatsClient
        except ImportError:
            raise ConfigurationError("--statsd needs the statsd package: pip install "
                                     "'airflow-upsert-provider[statsd]'", field="statsd") from None
        self.client = StatsClient(host, port, prefix=prefix or None, ipv6=":" in host)

    def send(self, batch: Sequence[metrics.Metric]) -> None:
        with self.client.pipeline() as pipe:
            for metric in batch:
                name = metrics.influx_name(metric)
                if metric.kind == metrics.COUNT:
                    pipe.incr(name, metric.value)
                elif metric.kind == metrics.TIMING:
                    pipe.timing(name, metric.value)
                else:
                    pipe.gauge(name, metric.value)


def sink_of(args: argparse.Namespace) -> StatsdSink | None:
    """The sink ``--statsd`` or ``UPSERT_STATSD`` asks for; None: metrics are off."""
    given = getattr(args, "statsd", None)
    text = given or os.environ.get(STATSD_ENV) or ""
    if not text:
        return None
    host, port = parse_statsd_address(text, "--statsd" if given else STATSD_ENV)
    return StatsdSink(host, port, os.environ.get(STATSD_PREFIX_ENV))


def after_command(ctx: Any, args: argparse.Namespace, started: float) -> None:
    """A maintenance command's duration, and the live runs after a compaction or a batch run."""
    sink = getattr(ctx, "metrics", None)
    if sink is None:
        return
    shard = getattr(args, "shard", None)
    operation = MAINTENANCE_COMMANDS.get(args.command)
    if args.command == "checkpoint" and args.checkpoint_command == "create":
        operation = "checkpoint"
    out: list[metrics.Metric] = []
    if operation is not None:
        out += metrics.maintenance_metrics(shard, operation, time.monotonic() - started)
    if args.command in ("compact", "run-batch"):
        try:
            out += metrics.live_runs_metrics(shard, len(ctx.shard(shard).live_runs()))
        except Exception as exc:  # noqa: BLE001 - the command succeeded; its duration is still sent
            metrics.log.warning("shard %s: live runs not counted for metrics (%s: %s)", shard, type(exc).__name__,
                                first_line(exc))
    metrics.send_quietly(sink, out)
