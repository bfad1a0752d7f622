"""Commands of a shard's stream and source: stream (stop, resume, status, history),
recover (begin, seek, resume, status) and source prune."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from airflow_upsert_provider.cli.context import Context
from airflow_upsert_provider.cli.options import actor_of, finite_number, integer_option
from airflow_upsert_provider.cli.output import iso, printable


def add_lifecycle_commands(commands, common: argparse.ArgumentParser) -> None:
    from airflow_upsert_provider.engine.store.stream_rules import DEFAULT_DRAIN_SECONDS

    shared = argparse.ArgumentParser(add_help=False)
    shared.add_argument("shard")
    shared.add_argument("--json", action="store_true")
    acting = argparse.ArgumentParser(add_help=False)
    acting.add_argument("--actor", help="who is recorded in the stream's history (default upsertctl:<host>:<pid>)")
    reason = argparse.ArgumentParser(add_help=False)
    reason.add_argument("--reason", default="", help="why, recorded in the stream's history")
    epoch = argparse.ArgumentParser(add_help=False)
    epoch.add_argument("--epoch", type=integer_option("--epoch", 0), default=None,
                       help="the recovery epoch you began (default: the open one); another epoch is refused")

    stream = commands.add_parser("stream", parents=[common], help="stop, resume or inspect a shard's stream")
    actions = stream.add_subparsers(dest="stream_command", required=True, metavar="ACTION")
    stop = actions.add_parser("stop", parents=[common, shared, acting, reason],
                              help="let the batch in hand commit, start no other, then STOPPED")
    stop.add_argument("--drain", type=finite_number("--drain", above_zero=False), default=DEFAULT_DRAIN_SECONDS, metavar="SECONDS",
                      help=f"wait at most this long for the batch in hand (default {DEFAULT_DRAIN_SECONDS:g})")
    stop.add_argument("--no-wait", action="store_true", help="leave the stream STOPPING; do not finalize")
    actions.add_parser("resume", parents=[common, shared, acting, reason], help="STOPPED -> READY")
    actions.add_parser("status", parents=[common, shared], help="the stream's status, epoch, who set it, when, why")
    history = actions.add_parser("history", parents=[common, shared], help="every change of the stream, oldest first")
    history.add_argument("--limit", type=integer_option("--limit", 1), default=None, metavar="N", help="only the last N changes")

    recover = commands.add_parser("recover", parents=[common], help="recovery in order: begin, seek, resume")
    steps = recover.add_subparsers(dest="recover_command", required=True, metavar="ACTION")
    steps.add_parser("begin", parents=[common, shared, acting, reason],
                     help="READY|STOPPED -> RECOVERING in a new epoch (fences every running writer)")
    steps.add_parser("seek", parents=[common, shared, acting, epoch],
                     help="position the source at the upper and check every segment still needed is there")
    steps.add_parser("resume", parents=[common, shared, acting, epoch],
                     help="RECOVERING -> READY, once the seek of the same epoch completed")
    steps.add_parser("status", parents=[common, shared], help="the stream, the upper and the next recovery step")

    source = commands.add_parser("source", parents=[common], help="the shard's landing directory")
    source_actions = source.add_subparsers(dest="source_command", required=True, metavar="ACTION")
    prune = source_actions.add_parser("prune", parents=[common, shared],
                                      help="delete the source segments the shard no longer needs (logged first)")
    prune.add_argument("--below", choices=("checkpoint", "committed"), default="checkpoint",
                       help="checkpoint (default): keep what the oldest checkpoint needs; committed: keep "
                            "only what the shard has not committed (a shard that will never be restored)")
    prune.add_argument("--dry-run", action="store_true", help="report what would go; delete nothing")


def _stream_line(state: dict[str, Any]) -> str:
    """``shard orders: STOPPED (epoch 0), set by ... at ...: why``, from a stream's dict."""
    from airflow_upsert_provider.engine.store.stream_rules import Status, StreamState

    described = StreamState(
        shard_id=state["shard"], status=Status(state["status"]), version=state["version"], epoch=state["epoch"],
        changed_by=state["changed_by"], changed_at=state["changed_at"], reason=state["reason"],
    ).describe()
    return printable(f"shard {state['shard']}: {described}")


def _print_transition(result: dict[str, Any]) -> None:
    print(_stream_line(result))
    if not result["changed"]:
        print(f"{result['action']}: nothing changed, the stream already was {result['status']}")


def cmd_stream(ctx: Context, args: argparse.Namespace) -> dict[str, Any]:
    from airflow_upsert_provider.engine.store import streams

    shard_id, action = args.shard, args.stream_command
    if action == "status":
        out = streams.read_stream(ctx.consensus, shard_id).to_dict()
        if not args.json:
            print(_stream_line(out))
            return {}
        return out
    if action == "history":
        rows = streams.stream_history(ctx.consensus, shard_id, limit=args.limit)
        if not args.json:
            for row in rows:
                print(_history_line(row))
            print(f"{len(rows)} change(s)")
            return {}
        return {"shard": shard_id, "history": rows}
    if action == "resume":
        out = streams.resume(ctx.consensus, shard_id, actor_of(args), args.reason).to_dict()
        if not args.json:
            _print_transition(out)
            return {}
        return out
    return _stop(ctx, args)


def _history_line(row: dict[str, Any]) -> str:
    line = (f"{iso(row['at'])}  v{row['version']}  {row['action']}: {row['from'] or '-'} -> {row['to']} "
            f"(epoch {row['epoch']}) by {row['actor']}")
    return printable(line + (f": {row['reason']}" if row["reason"] else ""))


def _stop(ctx: Context, args: argparse.Namespace) -> dict[str, Any]:
    from airflow_upsert_provider.engine.store import streams
    from airflow_upsert_provider.engine.store.stream_rules import Status

    actor = actor_of(args)
    if args.no_wait:
        out = streams.stop(ctx.consensus, args.shard, actor, args.reason).to_dict()
        if not args.json:
            _print_transition(out)
            if out["status"] == Status.STOPPING.value:
                print(f"left STOPPING: writers finish the batch in hand and start no other; "
                      f"`upsertctl stream stop {args.shard}` finalizes")
            return {}
        return {**out, "finalized": False, "batch_in_hand": None}
    tty = sys.stderr.isatty()
    waited = False

    def on_wait(remaining: float) -> None:
        nonlocal waited
        waited = True
        if tty:
            print(f"\r\033[Kwaiting up to {remaining:.0f}s for the batch in hand", end="", file=sys.stderr, flush=True)

    # time.sleep looked up now, not when the engine was imported: tests drive the drain.
    result = streams.stop_and_finalize(ctx.consensus, args.shard, actor, args.reason,
                                       drain_seconds=args.drain, sleep=time.sleep, on_wait=on_wait,
                                       staging_written_at=streams.staging_written_at(ctx.blob, args.shard))
    if tty and waited:
        print(file=sys.stderr)
    out = result.to_dict()
    stopped = result.state.status is Status.STOPPED
    # A writer still holding a batch when the drain ended is fenced at its commit.
    in_hand = stopped and streams.batch_in_hand(ctx.consensus, args.shard)
    if not args.json:
        _print_transition(out)
        if in_hand:
            print("a batch was still in hand when the drain ended: its commit will be fenced; nothing is "
                  "lost, the batch runs after the resume")
        if not stopped:
            print(f"the stop did not finish: the stream moved on to {result.state.status.value} meanwhile")
        return {}
    return {**out, "finalized": stopped, "batch_in_hand": in_hand}


def cmd_recover(ctx: Context, args: argparse.Namespace) -> dict[str, Any]:
    from airflow_upsert_provider.engine.lifecycle import recovery
    from airflow_upsert_provider.engine.store import streams

    shard_id, action = args.shard, args.recover_command
    if action == "begin":
        out = streams.begin_recovery(ctx.consensus, shard_id, actor_of(args), args.reason).to_dict()
        next_step = f"upsertctl recover seek {shard_id}"
    elif action == "seek":
        seek = recovery.seek(ctx.shard(shard_id), epoch=args.epoch, actor=actor_of(args))
        out = seek.to_dict()
        next_step = f"upsertctl recover resume {shard_id}"
        if not args.json:
            position = ", ".join(f"{p} from offset {o}" for p, o in sorted(seek.position.items())) or "every partition from offset 0"
            print(f"shard {shard_id}: seek of recovery epoch {seek.epoch} done at upper {seek.upper}")
            print(f"position: {position}")
            print(f"segments: {seek.segments_ahead} present from there on; {seek.checked} known segments checked")
            print(f"next: {next_step}")
            return {}
        return {**out, "next_step": next_step}
    elif action == "resume":
        out = streams.resume_after_recovery(ctx.consensus, shard_id, args.epoch, actor_of(args)).to_dict()
        next_step = f"upsertctl run-batch {shard_id} --until-caught-up"
    else:
        out = recovery.recovery_status(ctx.shard(shard_id))
        steps = {"seek": f"upsertctl recover seek {shard_id}", "resume": f"upsertctl recover resume {shard_id}"}
        next_step = steps.get(out["next_step"])
        if not args.json:
            print(_stream_line(out))
            print(f"upper: {out['upper']}")
            print(f"next: {next_step}" if next_step else "no recovery is open")
            return {}
        return out
    if not args.json:
        _print_transition(out)
        print(f"next: {next_step}")
        return {}
    return {**out, "next_step": next_step}


def cmd_source(ctx: Context, args: argparse.Namespace) -> dict[str, Any]:
    from airflow_upsert_provider.engine.maintenance.retention import prune

    report = prune(ctx.shard(args.shard), below=args.below, dry_run=args.dry_run)
    if not args.json:
        verb = "would delete" if args.dry_run else "deleted"
        held = (f"the oldest retained checkpoint, {report.checkpoint}" if report.checkpoint
                else "the shard's committed batches")
        for plan in report.partitions:
            line = f"{verb} {len(plan.delete)} files, {plan.bytes} bytes of partition {plan.partition} below offset {plan.bound}"
            if plan.kept_unbound:
                line += f"; kept {plan.kept_unbound} file(s) below it that no batch bound"
            print(line)
        if report.shared_with:
            print(f"held back also by shard(s) reading the same directory: {', '.join(report.shared_with)}")
        print(f"{verb} {report.files} files, {report.bytes} bytes, below the bound offsets of {held}"
              + ("" if args.dry_run or not report.files else "; each recorded in its partition's .retention.jsonl"))
        return {}
    return report.to_dict()
