"""Maintenance commands: compact, checkpoint (create, list, verify, restore), gc and publish."""

from __future__ import annotations

import argparse
import os
from typing import Any

from airflow_upsert_provider.cli.context import Context
from airflow_upsert_provider.cli.options import actor_of, finite_number, integer_option
from airflow_upsert_provider.cli.output import printable
from airflow_upsert_provider.engine.config import MAX_BUCKETS
from airflow_upsert_provider.engine.maintenance.compaction_policy import DEFAULT_MAX_RUNS


def add_maintenance_commands(commands, common: argparse.ArgumentParser, spark_conf: argparse.ArgumentParser) -> None:
    compact = commands.add_parser("compact", parents=[common, spark_conf],
                                  help="merge the batches below a new since with the compacted runs of similar size")
    compact.add_argument("shard")
    compact.add_argument("--since", type=integer_option("--since", 0), default=None, help="the new since (default: the upper)")
    compact.add_argument("--full", action="store_true",
                         help="merge every compacted run and batch below since into one run (rewrites the table)")
    compact.add_argument("--max-runs", type=integer_option("--max-runs", 1), default=DEFAULT_MAX_RUNS, metavar="N",
                         help="at most N compacted runs stay below since for a read to merge "
                              f"(default {DEFAULT_MAX_RUNS})")
    compact.add_argument("--buckets", type=integer_option("--buckets", 1, MAX_BUCKETS), default=None, metavar="N",
                         help="write with N hash buckets, a multiple of the current count (e.g. double it); "
                              "rewrites every compacted run (default: the current count, doubled when the shard's "
                              "target_bucket_bytes is exceeded)")
    compact.add_argument("--json", action="store_true")

    checkpoint = commands.add_parser("checkpoint", parents=[common], help="create, list, verify or restore checkpoints")
    actions = checkpoint.add_subparsers(dest="checkpoint_command", required=True, metavar="ACTION")
    create = actions.add_parser("create", parents=[common], help="checkpoint the shard at its upper (metadata only)")
    create.add_argument("shard")
    create.add_argument("--keep-last", type=integer_option("--keep-last", 1), default=None, metavar="N", help="then keep only the last N checkpoints")
    create.add_argument("--keep-within", type=finite_number("--keep-within", above_zero=True), default=None, metavar="SECONDS",
                        help="then keep only checkpoints newer than this (with --keep-last: either keeps)")
    create.add_argument("--full", action="store_true",
                        help="read every file whole, not only those no earlier checkpoint hashed")
    create.add_argument("--json", action="store_true")
    listing = actions.add_parser("list", parents=[common], help="the checkpoints in the shard's catalog")
    listing.add_argument("shard")
    listing.add_argument("--json", action="store_true")
    verify = actions.add_parser("verify", parents=[common], help="check every file a checkpoint lists")
    verify.add_argument("shard")
    verify.add_argument("checkpoint", nargs="?", help="checkpoint id (default: every checkpoint in the catalog)")
    verify.add_argument("--full", action="store_true",
                        help="read every file whole (SHA-256, Parquet footer); default: present and of the recorded "
                        "size, as each was hashed when its checkpoint was created")
    verify.add_argument("--json", action="store_true")
    restore = actions.add_parser("restore", parents=[common], help="rebuild a shard's consensus state from a checkpoint")
    restore.add_argument("shard", help="the shard whose catalog holds the checkpoint")
    restore.add_argument("checkpoint", nargs="?", help="checkpoint id (default: the latest)")
    restore.add_argument("--as", dest="target", metavar="SHARD", help="restore under this new shard id (default: the same id, into an empty consensus)")
    restore.add_argument("--actor", help="who is recorded in the stream's history (default upsertctl:<host>:<pid>)")
    restore.add_argument("--json", action="store_true")

    gc = commands.add_parser("gc", parents=[common], help="delete files nothing references")
    gc.add_argument("shard")
    gc.add_argument("--sweep", action=argparse.BooleanOptionalAction, default=True,
                    help="list the shard's directory and delete what no state names too (staged files of failed "
                    "writers, task attempts' files, abandoned checkpoints, expired rejects), the default; "
                    "--no-sweep deletes only the runs the store recorded as replaced, with requests that follow "
                    "the garbage, not the history: run it each cycle and the sweep on a slower cadence")
    gc.add_argument("--dry-run", action="store_true", help="list what would go and its bytes; delete nothing")
    gc.add_argument("--grace", type=finite_number("--grace", above_zero=False), default=None, metavar="SECONDS",
                    help="keep files younger than this whatever references them (default 6 hours)")
    gc.add_argument("--rejects-retention", type=finite_number("--rejects-retention", above_zero=False), default=None,
                    metavar="SECONDS", help="delete quarantined records of batches below since once older than "
                    "this (default 30 days; 0 keeps them forever)")
    gc.add_argument("--json", action="store_true")

    publish = commands.add_parser("publish", parents=[common, spark_conf],
                                  help="publish the table as of since as a snapshot of an Iceberg table")
    publish.add_argument("shard")
    publish.add_argument("--iceberg", required=True, metavar="NAMESPACE.TABLE",
                         help="the Iceberg table; created on the first publish")
    publish.add_argument("--catalog-uri", default=None, metavar="URI",
                         help="a REST catalog (http[s]://...) or a SQL catalog's database URL; default "
                              "UPSERT_ICEBERG_CATALOG_URI (where a URL with a password belongs: argv is visible "
                              "to ps), else the SQL catalog in the consensus store, tables under "
                              "<blob root>/_iceberg (docs/readers.md)")
    publish.add_argument("--keep-last", type=int, default=None, metavar="N",
                         help="after the publish, keep the newest N snapshots of the table (default 10) and "
                              "those younger than --keep-within; delete the others and the files only they used")
    publish.add_argument("--keep-within", type=float, default=None, metavar="SECONDS",
                         help="also keep snapshots younger than this (default 0: by --keep-last only)")
    publish.add_argument("--no-expire", action="store_true",
                         help="keep every snapshot (an expiry elsewhere bounds the table's storage)")
    publish.add_argument("--spark", action="store_true",
                         help="Spark's executors (--master, --remote) merge and write the data files, on a path "
                              "they all reach or on object storage with their own credentials; default: read and "
                              "written in this process, without Spark (docs/readers.md)")
    publish.add_argument("--json", action="store_true")


def cmd_compact(ctx: Context, args: argparse.Namespace) -> dict[str, Any]:
    from airflow_upsert_provider.engine.maintenance.compaction import check_before_spark, compact

    shard = ctx.shard(args.shard)
    check_before_spark(shard, since=args.since, buckets=args.buckets, buckets_name="--buckets")
    return compact(ctx.spark(), shard, since=args.since, full=args.full, max_runs=args.max_runs,
                   buckets=args.buckets).to_dict()


def cmd_checkpoint(ctx: Context, args: argparse.Namespace) -> dict[str, Any]:
    from airflow_upsert_provider.engine.maintenance.checkpoint import create_checkpoint
    from airflow_upsert_provider.engine.maintenance.checkpoint_catalog import Catalog, checkpoints_root
    from airflow_upsert_provider.engine.maintenance.checkpoint_restore import restore_checkpoint
    from airflow_upsert_provider.engine.maintenance.checkpoint_verify import verify_checkpoint
    from airflow_upsert_provider.engine.store import streams
    from airflow_upsert_provider.engine.errors import ConfigurationError, ShardNotFound

    if args.checkpoint_command == "create":
        shard = ctx.shard(args.shard)
        entry = create_checkpoint(shard, keep_last=args.keep_last, keep_within=args.keep_within, full=args.full)
        return {"shard": shard.shard_id, "checkpoint": entry.to_dict()}
    # list, verify and restore work on an empty store too: a restore runs against one.
    shard_id = args.shard
    if not ctx.blob.is_dir(checkpoints_root(ctx.blob, shard_id)):
        try:
            ctx.consensus.get_shard(shard_id)
        except ShardNotFound:
            raise ConfigurationError(
                f"no shard {shard_id!r} in the consensus and no checkpoints of it in {ctx.blob.root}",
                shard=shard_id,
            ) from None

    # The store's catalog once it holds it (a blob copy can lag it by one change after a
    # crash), else the blob copy's: a store that never held it, one being restored into.
    catalog = Catalog.load(ctx.blob, shard_id, ctx.consensus)
    if args.checkpoint_command == "list":
        entries = [e.to_dict() for e in catalog.entries]
        if not args.json:
            for e in entries:
                print(f"{e['id']}  upper {e['upper']}  since {e['since']}  {e['files']} files  {e['bytes']} bytes")
            print(f"{len(entries)} checkpoint(s)")
            return {}
        return {"shard": shard_id, "checkpoints": entries}
    if args.checkpoint_command == "verify":
        ids = [args.checkpoint] if args.checkpoint else [e.id for e in catalog.entries]
        verified = []
        for checkpoint_id in ids:
            manifest = verify_checkpoint(ctx.blob, shard_id, checkpoint_id, ctx.consensus, full=args.full)
            verified.append({"id": checkpoint_id, "files": len(manifest["files"]), "ok": True})
        return {"shard": shard_id, "verified": verified}
    latest = catalog.latest()
    checkpoint_id = args.checkpoint or (latest.id if latest else None)
    if checkpoint_id is None:
        raise ConfigurationError(f"shard {shard_id!r} has no checkpoint to restore", shard=shard_id)
    record = restore_checkpoint(ctx.consensus, ctx.blob, shard_id, checkpoint_id, target_shard_id=args.target,
                                     actor=actor_of(args))
    state = streams.read_stream(ctx.consensus, record.shard_id)
    next_step = f"upsertctl recover seek {record.shard_id}"
    if not args.json:
        print(f"restored shard {record.shard_id} from checkpoint {checkpoint_id} of shard {shard_id}: "
              f"upper {record.upper}, since {record.since}")
        print(printable(f"shard {record.shard_id}: {state.describe()}"))
        print(f"next: {next_step}, then upsertctl recover resume {record.shard_id} (docs/recovery.md)")
        return {}
    return {"shard": record.shard_id, "checkpoint": checkpoint_id, "upper": record.upper, "since": record.since,
            "stream": state.to_dict(), "next_step": next_step}


def cmd_gc(ctx: Context, args: argparse.Namespace) -> dict[str, Any]:
    from airflow_upsert_provider.engine.maintenance.gc import (
        DEFAULT_GRACE_SECONDS,
        DEFAULT_REJECTS_RETENTION_SECONDS,
        collect_garbage,
    )

    grace = DEFAULT_GRACE_SECONDS if args.grace is None else args.grace
    retention = DEFAULT_REJECTS_RETENTION_SECONDS if args.rejects_retention is None else args.rejects_retention
    report = collect_garbage(ctx.consensus, ctx.blob, args.shard, grace_seconds=grace,
                             rejects_retention_seconds=retention, dry_run=args.dry_run, sweep=args.sweep)
    if not args.json:
        verb = "would delete" if args.dry_run else "deleted"
        for item in report.items:
            print(f"{verb} {item.kind} {item.path} ({item.files} files, {item.bytes} bytes)")
        for skipped in report.skipped:
            print(f"skipped {skipped['path']}: {skipped['reason']}")
        for foreign in report.foreign:
            print(f"kept foreign file {foreign['path']} ({foreign['bytes']} bytes): not in the layout this project writes")
        for unreadable in report.unreadable_catalogs:
            print(f"skipped the catalog of {unreadable['path']} (no shard of this store): {unreadable['reason']}")
        print(f"{verb} {len(report.items)} item(s), {report.files} files, {report.bytes} bytes; "
              f"kept {report.kept_referenced} referenced and {report.kept_in_grace} in the grace period")
        if not report.swept and report.pending:
            print("left recorded for a later GC: " + ", ".join(f"{n} {reason}" for reason, n in report.pending.items()))
        if report.history.get("batches") or report.history.get("bindings"):
            print(f"rolled up and truncated {report.history['batches']} batch and {report.history['bindings']} "
                  f"binding rows below ts {report.history['kept_from']}")
        return {}
    return report.to_dict()


def cmd_publish(ctx: Context, args: argparse.Namespace) -> dict[str, Any]:
    from airflow_upsert_provider.cli.context import consensus_url
    from airflow_upsert_provider.engine.errors import ConfigurationError
    from airflow_upsert_provider.engine.maintenance import iceberg
    from airflow_upsert_provider.engine.maintenance.iceberg_expiry import retention

    # Checked before the shard is opened, also under --no-expire: a bad value is a mistake.
    policy = retention(args.keep_last, args.keep_within)
    if ctx.spark_conf and not args.spark:
        raise ConfigurationError("--conf sets the Spark session of a publish with --spark; without it no Spark "
                                 "starts", field="conf")
    shard = ctx.shard(args.shard)
    result = iceberg.publish_to_catalog(
        shard, args.iceberg, consensus_url=consensus_url(args), blob_root=ctx.blob.root,
        catalog_uri=args.catalog_uri or os.environ.get("UPSERT_ICEBERG_CATALOG_URI") or None,
        retention=None if args.no_expire else policy, spark=ctx.spark() if args.spark else None,
    )
    if args.json:
        return result.to_dict()
    if result.outcome == iceberg.PUBLISHED:
        print(f"published snapshot {result.snapshot_id} at since {result.since} to {printable(result.table)} "
              f"({result.rows} rows, {result.files} files, {result.bytes} bytes)")
    else:
        print(f"nothing to publish ({printable(result.reason)})")
    if result.expired or result.deleted_files:
        print(f"expired {result.expired} snapshots, deleted {result.deleted_files} files")
    return {}
