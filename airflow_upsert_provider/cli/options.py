"""Parser pieces shared by the commands, the ``type=`` validators of option values, and the
defaults every command reads from the global options or the environment."""

from __future__ import annotations

import argparse
import math
import os
import re
import socket
from typing import Callable, Sequence

from airflow_upsert_provider.engine.errors import ConfigurationError

DEFAULT_CONSENSUS_URL = "sqlite:///./.upsert/consensus.db"
DEFAULT_BLOB_ROOT = "./.upsert/blob"


def common_options() -> argparse.ArgumentParser:
    # Accepted before or after the command: `upsertctl --consensus X status s` and
    # `upsertctl status s --consensus X` mean the same.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--consensus", default=argparse.SUPPRESS, metavar="URL", help="consensus store URL")
    common.add_argument("--conn-id", default=argparse.SUPPRESS, metavar="CONN",
                        help="take the consensus URL (its password included) and the blob root from this Airflow "
                             "connection of type upsert (AIRFLOW_CONN_*, a secrets backend or Airflow's metadata "
                             "database; Airflow must be installed): no password on the command line")
    common.add_argument("--blob-root", default=argparse.SUPPRESS, metavar="PATH|URI", type=blob_root_option,
                        help="root of runs and checkpoints: a local path, or s3://BUCKET/PREFIX (gs://, abfs[s]://, "
                             "hdfs:// through the same layer; docs/storage.md)")
    common.add_argument("--master", default=argparse.SUPPRESS, help="Spark master (default local[*])")
    common.add_argument("--remote", default=argparse.SUPPRESS, metavar="sc://HOST:PORT",
                        help="run Spark through this Spark Connect server instead of in this process "
                             "(default from UPSERT_SPARK_REMOTE; see upsertctl spark-server)")
    common.add_argument("--kafka-config", default=argparse.SUPPRESS, metavar="FILE",
                        help="Kafka client config of a kafka:TOPIC shard: a JSON object of librdkafka properties "
                             "(bootstrap.servers required); default from UPSERT_KAFKA_CONFIG")
    from airflow_upsert_provider.cli.metrics import statsd_option

    common.add_argument("--statsd", default=argparse.SUPPRESS, metavar="HOST:PORT", type=statsd_option,
                        help="send the command's metrics to this StatsD server over UDP (default from "
                             "UPSERT_STATSD; none: nothing is sent; docs/metrics.md)")
    return common




def spark_conf_option() -> argparse.ArgumentParser:
    # On the commands that run Spark only, after the command: a setting given to a command
    # that starts no session would be ignored without a word.
    option = argparse.ArgumentParser(add_help=False)
    option.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", dest="spark_conf",
                        help="a Spark setting for this command's session, e.g. spark.sql.shuffle.partitions=4 "
                             "(repeatable); with --remote the command gets a server session of its own")
    return option


def parse_key_values(items: Sequence[str], option: str) -> dict[str, str]:
    """``KEY=VALUE`` items of a repeatable option as a dict (the value may hold '=')."""
    settings = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigurationError(f"{option} takes KEY=VALUE, not {item!r}", field=option.lstrip("-"))
        settings[key.strip()] = value
    return settings


# Integers go to SQLite / PostgreSQL BIGINT columns and Spark longs: 64 bits, signed.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

# The argparse ``type=`` functions below raise ConfigurationError, which argparse lets through
# (it turns only ValueError and TypeError into a usage line): a bad value is then reported as
# every bad value is (exit 2, the option named, an error object with --json), before any store,
# blob root or Spark session is opened.


def _shown(text: str) -> str:
    """A value as an error message quotes it: repr (control characters escaped), cut short."""
    return repr(text) if len(text) <= 40 else f"{text[:20]!r}... ({len(text)} characters)"


def _field(option: str) -> str:
    return option.lstrip("-").replace("-", "_")


# Plain decimal digits, a minus sign at most: int() would also take "1_0" as 10, " 3 " as 3 and
# digits of other scripts, none of which a user means as a number here.
_DECIMAL_INTEGER = re.compile(r"-?[0-9]+")


def integer_option(option: str, minimum: int = INT64_MIN, maximum: int = INT64_MAX) -> Callable[[str], int]:
    """The ``type=`` of every integer option: plain decimal digits (a minus sign at most), an
    integer from ``minimum`` to ``maximum``, never beyond 64 bits (what the store and Spark hold)."""
    low = "-2**63" if minimum == INT64_MIN else str(minimum)
    high = "2**63-1" if maximum == INT64_MAX else str(maximum)

    def integer(text: str) -> int:
        value: int | None = None
        if _DECIMAL_INTEGER.fullmatch(text):
            try:
                value = int(text)
            except ValueError:
                pass  # more digits than int() converts (far beyond 64 bits)
        if value is None or not minimum <= value <= maximum:
            raise ConfigurationError(f"{option} takes an integer from {low} to {high}, not {_shown(text)}",
                                     field=_field(option))
        return value

    return integer


def finite_number(option: str, *, above_zero: bool) -> Callable[[str], float]:
    """The ``type=`` of every option of seconds: a finite number, above zero or zero or more.
    ``nan`` compares false with every bound, and ``inf`` (also what float() makes of a number
    with too many digits) never ends a wait."""
    wanted = f"a finite number of seconds {'above zero' if above_zero else '>= 0'}"

    def number(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value < 0 or (above_zero and value == 0):
            raise ConfigurationError(f"{option} takes {wanted}, not {_shown(text)}", field=_field(option))
        return value

    return number


def duration_option(option: str) -> Callable[[str], float]:
    """The ``type=`` of an option of a duration (``90``, ``90s``, ``10m``, ``1h30m``):
    :func:`~airflow_upsert_provider.engine.common.time_text.parse_duration`, positive and finite."""

    def duration(text: str) -> float:
        from airflow_upsert_provider.engine.common.time_text import parse_duration

        return parse_duration(text, field=option)

    return duration


def blob_root_option(text: str) -> str:
    """The ``type=`` of ``--blob-root``: a local path or the URI of a supported store; an
    unknown scheme, or credentials written into the URI, is refused naming the value (without
    the credentials). ``UPSERT_BLOB_ROOT`` gets the same check when the root is opened."""
    from airflow_upsert_provider.engine.blob.filesystems import split_uri

    split_uri(text)
    return text


def blob_root(args: argparse.Namespace) -> str:
    return getattr(args, "blob_root", None) or os.environ.get("UPSERT_BLOB_ROOT") or DEFAULT_BLOB_ROOT


def actor_of(args: argparse.Namespace) -> str:
    """Who a change is recorded as: ``--actor``, else this process (as a writer id starts)."""
    return getattr(args, "actor", None) or f"upsertctl:{socket.gethostname()}:{os.getpid()}"
