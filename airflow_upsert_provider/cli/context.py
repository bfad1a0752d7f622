"""The engine objects a command works on (consensus store, blob root, Spark on demand),
built from the global options."""

from __future__ import annotations

import argparse
import os

from airflow_upsert_provider.cli.metrics import sink_of
from airflow_upsert_provider.cli.options import DEFAULT_CONSENSUS_URL, blob_root, parse_key_values

# Commands that open no shard and no blob root, and no store through the context: `db`
# opens the store itself, whatever its schema revision.
NO_STORE_COMMANDS = ("spark-server", "spark-archive", "db")


def consensus_url(args: argparse.Namespace) -> str:
    """The consensus URL of a command: --consensus, else UPSERT_CONSENSUS_URL, else the default."""
    return getattr(args, "consensus", None) or os.environ.get("UPSERT_CONSENSUS_URL") or DEFAULT_CONSENSUS_URL


def blob_access(args: argparse.Namespace) -> str:
    """How a command uses the blob root: ``create`` it (init), ``write`` below it, or only
    ``read`` (a missing root is then left to the command: an unknown shard says so)."""
    if args.command == "init":
        return "create"
    if args.command in ("run-batch", "compact", "publish") or (args.command == "gc" and not args.dry_run):
        return "write"
    if args.command == "checkpoint" and args.checkpoint_command == "create":
        return "write"
    return "read"



class Context:
    """Engine objects built from the global options, Spark only on demand."""

    def __init__(self, args: argparse.Namespace) -> None:
        from airflow_upsert_provider.engine.blob.files import open_blob
        from airflow_upsert_provider.engine.common.connect_address import parse_remote
        from airflow_upsert_provider.engine.spark.session import resolve_remote
        from airflow_upsert_provider.engine.store.registry import open_consensus

        # A malformed setting is a usage error, found before the store or the blob root is touched.
        self.spark_conf = parse_key_values(getattr(args, "spark_conf", []), "--conf")
        self.metrics = sink_of(args)  # None: metrics off; UPSERT_STATSD checked here, as --statsd is
        # Refused whether or not this command starts Spark: the two flags contradict each other;
        # a malformed address is refused before the store is opened, not when Spark starts.
        remote = resolve_remote(getattr(args, "master", None), getattr(args, "remote", None))
        if remote:
            parse_remote(remote)
        url = consensus_url(args)
        self.blob = open_blob(blob_root(args))
        # Checked up front, with a message naming the root, before any Spark job writes there.
        access = blob_access(args)
        if access == "create":
            self.blob.ensure_root()
        if access in ("create", "write"):
            self.blob.check_root()
        elif "://" in self.blob.root or os.path.exists(self.blob.root):
            # On object storage a prefix need not exist, but its bucket and endpoint must answer.
            self.blob.check_root(writable=False)
        self.consensus = open_consensus(url)
        self.master = getattr(args, "master", None)
        self.remote = getattr(args, "remote", None)
        self._spark = None
        path = getattr(args, "kafka_config", None) or os.environ.get("UPSERT_KAFKA_CONFIG")
        self.kafka_config_path = path or None
        self._kafka_config = None

    def spark(self):
        if self._spark is None:
            from airflow_upsert_provider.engine.spark.session import get_spark

            # A Kafka client config with secrets is registered in the session with the slice
            # reader: then the session is this run's own, not the shared Connect one.
            secrets = self._kafka_config is not None and bool(self._kafka_config.secret_values())
            self._spark = get_spark(self.master, conf=self.spark_conf or None, remote=self.remote, private=secrets)
        return self._spark

    def kafka_config(self):
        """The Kafka client config from --kafka-config (or UPSERT_KAFKA_CONFIG); None if
        neither is given (a Kafka shard then says how to give one when it needs it)."""
        if self._kafka_config is None and self.kafka_config_path:
            from airflow_upsert_provider.engine.sources.kafka_options import load_kafka_config

            self._kafka_config = load_kafka_config(self.kafka_config_path)
        return self._kafka_config

    def shard(self, shard_id: str):
        from airflow_upsert_provider.engine.table.shard import Shard

        shard = Shard.open(self.consensus, self.blob, shard_id)
        if shard.is_kafka and self.kafka_config_path:
            # Read only for a Kafka shard: a directory shard does not depend on a Kafka setting.
            shard = Shard(self.consensus, self.blob, shard_id, shard.config, kafka_config=self.kafka_config())
        return shard

