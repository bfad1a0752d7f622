"""``upsertctl changes``: a shard's change feed, and its change retention (docs/changes.md).

- ``changes SHARD --from A [--to B] [--format parquet|arrow|jsonl] [--out PATH]``: per key the
  net change over the batches ``A <= ts < B`` (B defaults to the upper), read without Spark.
- ``changes retention SHARD [--keep 7d | --off]``: show or set how long compaction keeps the
  batches a feed needs, and what that holds now.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import sys
from typing import Any

from airflow_upsert_provider.cli.context import Context
from airflow_upsert_provider.cli.options import integer_option
from airflow_upsert_provider.cli.shard import STDOUT, _check_out_path, _replacing_out, _text, _writes_to
from airflow_upsert_provider.engine.errors import ConfigurationError

FEED_FORMATS = ("jsonl", "parquet", "arrow")
# `changes retention SHARD`: the word before the shard that selects the retention command.
RETENTION = "retention"


def add_changes_commands(commands, common: argparse.ArgumentParser) -> None:
    changes = commands.add_parser(
        "changes", parents=[common],
        help="the net change per key over a range of batches (no Spark); `changes retention SHARD` for the "
             "change retention",
    )
    changes.add_argument("shard", help=f"the shard (or `{RETENTION}` followed by the shard)")
    changes.add_argument("retention_shard", nargs="?", metavar="SHARD",
                         help=f"with `{RETENTION}`: the shard whose change retention to show or set")
    changes.add_argument("--from", dest="from_ts", type=integer_option("--from", 0),
                         help="the first batch ts of the range (inclusive)")
    changes.add_argument("--to", dest="to_ts", type=integer_option("--to", 0), default=None,
                         help="the end of the range (exclusive; default: the upper)")
    changes.add_argument("--format", choices=FEED_FORMATS, default="jsonl", dest="output_format",
                         help="jsonl (stdout unless --out), parquet or arrow (an Arrow IPC file; --out required)")
    changes.add_argument("--out", help="write to this file (renamed into place once complete)")
    changes.add_argument("--preimages", action="store_true",
                         help="also each update's row as of --from (update_preimage) and each deleted row's values; "
                              "reads the values of the table as of --from, not only its keys")
    changes.add_argument("--keep", help=f"with `{RETENTION}`: keep the batches of this period (e.g. 7d, 36h)")
    changes.add_argument("--off", action="store_true", help=f"with `{RETENTION}`: remove the change retention")
    changes.add_argument("--json", action="store_true")


def cmd_changes(ctx: Context, args: argparse.Namespace) -> dict[str, Any]:
    if args.shard == RETENTION and args.retention_shard is not None:
        if args.preimages:
            raise ConfigurationError(f"--preimages goes with a feed (`changes SHARD --from TS`), not `changes "
                                     f"{RETENTION}`", field="--preimages")
        return _retention(ctx, args)
    if args.retention_shard is not None:
        raise ConfigurationError(f"changes takes one shard; `changes {RETENTION} SHARD` shows or sets the "
                                 "change retention", field="shard")
    for option, given in (("--keep", args.keep is not None), ("--off", args.off)):
        if given:
            raise ConfigurationError(f"{option} goes with `changes {RETENTION} SHARD`", field=option)
    if args.from_ts is None:
        raise ConfigurationError("changes needs --from TS (the first batch of the range)", field="--from")
    return _feed(ctx, args)


def _feed(ctx: Context, args: argparse.Namespace) -> dict[str, Any]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from airflow_upsert_provider.engine.table.changes import read_changes

    fmt = args.output_format
    out = None if args.out in (None, STDOUT) else args.out
    if fmt != "jsonl" and out is None:
        raise ConfigurationError(f"changes --format {fmt} writes a file: give --out PATH (not stdout)", field="out")
    _check_out_path(out)
    shard = ctx.shard(args.shard)
    # The range is checked and its runs chosen before --out is touched.
    reader = read_changes(shard, args.from_ts, args.to_ts, preimages=args.preimages)
    rows = 0
    with _writes_to(out), contextlib.ExitStack() as stack:
        handle = None if out is None else _replacing_out(stack, out)
        if fmt == "parquet":
            with pq.ParquetWriter(handle, reader.schema) as writer:
                for batch in reader:
                    writer.write_batch(batch)
                    rows += batch.num_rows
        elif fmt == "arrow":
            with pa.ipc.new_file(handle, reader.schema) as writer:
                for batch in reader:
                    writer.write_batch(batch)
                    rows += batch.num_rows
        else:
            text = sys.stdout if handle is None else _text(stack, handle)
            for batch in reader:
                for row in batch.to_pylist():
                    text.write(json.dumps(row, default=_json_value) + "\n")
                rows += batch.num_rows
    if out is None:
        return {}  # the rows went to stdout: nothing else is printed there
    return {"shard": shard.shard_id, "from_ts": args.from_ts, "to_ts": _range_end(shard, args.to_ts),
            "rows": rows, "out": out}


def _range_end(shard, to_ts: int | None) -> int:
    return shard.state().upper if to_ts is None else to_ts


def _json_value(value: Any) -> str:
    if isinstance(value, datetime.datetime):
        return value.isoformat()
    return str(value)


def _retention(ctx: Context, args: argparse.Namespace) -> dict[str, Any]:
    from airflow_upsert_provider.engine.maintenance.change_retention import retention_cost
    from airflow_upsert_provider.engine.store.change_feed import set_change_retention
    from airflow_upsert_provider.engine.table.change_rules import parse_keep

    if args.keep is not None and args.off:
        raise ConfigurationError("give --keep PERIOD or --off, not both", field="--keep")
    for option, given in (("--from", args.from_ts is not None), ("--to", args.to_ts is not None),
                          ("--out", args.out is not None)):
        if given:
            raise ConfigurationError(f"{option} goes with `changes SHARD`, not `changes {RETENTION}`", field=option)
    shard = ctx.shard(args.retention_shard)
    if args.keep is not None:
        set_change_retention(shard.consensus, shard.shard_id, parse_keep(args.keep, field="--keep"))
    elif args.off:
        set_change_retention(shard.consensus, shard.shard_id, None)
    return {"shard": shard.shard_id, **retention_cost(shard.consensus, shard.shard_id).to_dict()}
