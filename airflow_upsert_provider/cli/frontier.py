"""`upsertctl frontier`: observe shards' frontiers and evaluate the stall rules
(docs/frontier.md)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from airflow_upsert_provider.cli.context import Context
from airflow_upsert_provider.cli.options import actor_of, duration_option, integer_option
from airflow_upsert_provider.cli.output import iso


def add_frontier_commands(commands, common: argparse.ArgumentParser) -> None:
    frontier = commands.add_parser("frontier", parents=[common],
                                   help="observe shards' frontiers; evaluate the stall rules (docs/frontier.md)")
    actions = frontier.add_subparsers(dest="frontier_command", required=True, metavar="ACTION")
    observe = actions.add_parser("observe", parents=[common],
                                 help="record one observation of each shard (every shard without arguments)")
    observe.add_argument("shards", nargs="*", metavar="SHARD")
    observe.add_argument("--json", action="store_true")
    status = actions.add_parser("status", parents=[common],
                                help="observe the shard, then print its status, the rule, the reasons and the "
                                     "window; exit 2 if the shard does not exist (status NOT_FOUND)")
    status.add_argument("shard")
    status.add_argument("--json", action="store_true")
    status.add_argument("--no-observe", action="store_true",
                        help="evaluate the recorded observations only; record none")
    prune = actions.add_parser("prune", parents=[common],
                               help="delete observations, stream history and alert rows older than their "
                                    "retention (docs/frontier.md, 'Retention')")
    for option, field, default in PRUNE_OPTIONS:
        prune.add_argument(option, dest=field, type=duration_option(option), default=None, metavar="DURATION",
                           help=f"keep this long (seconds, or e.g. 12h, 2160h); default {default}")
    prune.add_argument("--json", action="store_true")
    settings = status.add_argument_group("stall rules (defaults in docs/frontier.md)")
    for option, field, kind, help_text in FRONTIER_SETTING_OPTIONS:
        if kind is bool:
            settings.add_argument(option, dest=field, action="store_true", default=None, help=help_text)
        else:
            settings.add_argument(option, dest=field, type=kind, default=None, metavar="N", help=help_text)


# (option, HistoryRetention field, default shown) of `upsertctl frontier prune`.
PRUNE_OPTIONS = (
    ("--keep-observations", "observations_seconds", "24h"),
    ("--keep-stream-history", "stream_history_seconds", "90 days"),
    ("--keep-alerts", "alerts_seconds", "90 days"),
)

# (option, StallSettings field, type, help) of `upsertctl frontier status`.
# StallSettings checks each value (finite, in range) and names its field; the integer is
# kept to 64 bits here, as every integer option is.
FRONTIER_SETTING_OPTIONS = (
    ("--window", "window_seconds", float, "seconds of observations looked at"),
    ("--cadence", "cadence_seconds", float, "seconds between the batches the schedule runs"),
    ("--stall-multiplier", "stall_multiplier", float, "stalled after this many cadences without an advance"),
    ("--min-stall", "min_stall_seconds", float, "stalled after at least these seconds"),
    ("--stale-after", "stale_after_seconds", float, "STALE when the newest observation is older"),
    ("--lag-objective", "lag_seconds_objective", float, "LAGGING when lag_seconds is above it"),
    ("--page-on-lagging", "page_on_lagging", bool, "LAGGING breaches (pages) too"),
    ("--max-stopped", "max_stopped_seconds", float, "STOPPED/RECOVERING longer than this breaches"),
    ("--consecutive-breaches", "consecutive_breaches", integer_option("--consecutive-breaches"),
     "breaching evaluations in a row before a page"),
)


def _observation_line(obs: dict[str, Any]) -> str:
    from airflow_upsert_provider.engine.sources.lag import format_pending

    return (f"shard {obs['shard_id']}: upper {obs['upper']}, last commit {iso(obs['last_commit_at'])}, "
            f"{format_pending(obs['lag'], obs['lag_unit'], obs['lag_seconds'])}, stream {obs['stream_status']}")


def cmd_frontier(ctx: Context, args: argparse.Namespace) -> dict[str, Any]:
    from airflow_upsert_provider.engine.frontier import observations

    if args.frontier_command == "observe":
        report = observations.observe_shards(ctx.consensus, ctx.blob, args.shards or None, observer=actor_of(args),
                                             open_shard=ctx.shard)
        out = [o.to_dict() for o in report.observations]
        if report.unobservable:
            # Every other shard was observed and recorded; these are named, and the exit says so.
            for shard_id, reason in report.unobservable.items():
                print(f"upsertctl: shard {shard_id}: not observable: {reason}", file=sys.stderr)
            args.exit_code = 2
        if not args.json:
            for obs in out:
                print(_observation_line(obs))
            print(f"{len(out)} observation(s) recorded"
                  + (f", {len(report.unobservable)} shard(s) not observable" if report.unobservable else ""))
            return {}
        return {"observations": out, "unobservable": report.unobservable}
    if args.frontier_command == "prune":
        from airflow_upsert_provider.engine.frontier.history import HistoryRetention, describe, prune_history

        given = {field: getattr(args, field) for _, field, _ in PRUNE_OPTIONS if getattr(args, field) is not None}
        deleted = prune_history(ctx.consensus, HistoryRetention(**given))
        if not args.json:
            print(f"deleted {describe(deleted)}")
            return {}
        return {"deleted": deleted}
    from airflow_upsert_provider.engine.frontier.alerts import judging_settings
    from airflow_upsert_provider.engine.frontier.model import StallSettings

    given = {field: getattr(args, field) for _, field, _, _ in FRONTIER_SETTING_OPTIONS
             if getattr(args, field) is not None}
    # One verdict with the monitor and the shard page: the settings its monitor last evaluated
    # with, unless thresholds are given here (they replace the monitor's, unset ones default).
    if given:
        settings, judged_with, note = StallSettings(**given), "command line", None
    else:
        settings, note = judging_settings(observations.load_alert_state(ctx.consensus, args.shard)[0])
        judged_with = "defaults" if note else "monitor"
    result = observations.peek_shard(ctx.consensus, ctx.blob, args.shard, settings, observer=actor_of(args),
                                     observe_first=not args.no_observe, open_shard=ctx.shard)
    out = {**result.to_dict(), "judged_with": judged_with, "note": note, "page": _page_outlook(result, settings)}
    if ctx.metrics is not None:
        from airflow_upsert_provider.engine.common.metrics import frontier_metrics, send_quietly

        send_quietly(ctx.metrics, frontier_metrics(out["evaluation"]))
    if result.evaluation.status.value == "NOT_FOUND":
        # The same shape as for a known shard (status NOT_FOUND), and exit 2: nothing to watch.
        print(f"upsertctl: unknown shard {args.shard!r} in the consensus store", file=sys.stderr)
        args.exit_code = 2
    if not args.json:
        _print_frontier_status(out)
        return {}
    return out


def _page_outlook(result: Any, settings: Any) -> str:
    """What the monitor would do with this verdict: page now, page after more breaching
    evaluations, keep the page it has open, or not page."""
    evaluation, state = result.evaluation, result.state
    if not evaluation.breach:
        return "does not page"
    if state.firing:
        return f"page open since {iso(state.incident_started_at)}"
    more = settings.consecutive_breaches - state.consecutive_breaches
    return "pages" if more <= 1 else f"pages after {more} breaching evaluations in a row"


def _print_frontier_status(out: dict[str, Any]) -> None:
    from airflow_upsert_provider.engine.common.time_text import format_duration_to_the_second
    from airflow_upsert_provider.engine.frontier.model import partition_lag_text
    from airflow_upsert_provider.engine.sources.lag import format_pending

    ev, state = out["evaluation"], out["state"]
    print(f"shard {out['shard']}: {ev['status']}" + (f" ({ev['severity']}, {out['page']})" if ev["severity"] else ""))
    print(f"rule: {ev['rule']}")
    for reason in ev["reasons"]:
        print(f"  - {reason}")
    if ev["upper"] is not None:
        stuck = "" if ev["stuck_seconds"] is None else f", stuck {format_duration_to_the_second(ev['stuck_seconds'])}"
        print(f"upper: {ev['upper']}, last advance {iso(ev['last_advance_at'])}{stuck}")
    if ev["lag"] is not None:
        print(f"lag: {format_pending(ev['lag'], ev['lag_unit'], ev['lag_seconds'])}")
    if ev.get("partition_lag") is not None:
        print(f"lag per partition: {partition_lag_text(ev['partition_lag'], ev['lag_unit'])}")
    window = ev["window"] or {}
    if window:
        print(f"window: {window.get('samples')} observation(s) from {iso(window.get('start'))} to "
              f"{iso(window.get('end'))} ({format_duration_to_the_second(window.get('seconds'))} looked at)")
    print("judged with: " + {"monitor": f"the monitor's settings (last evaluation by {state.get('evaluated_by')})",
                             "command line": "the thresholds given here"}.get(out["judged_with"], out["note"] or ""))
    if state.get("firing"):
        print(f"alert: firing ({state.get('firing_status')}) since {iso(state.get('incident_started_at'))}")
    if state.get("pages_sent") or state.get("unsent_reason"):
        print(f"pages sent: {state.get('pages_sent') or 'none'}"
              + (f", last {iso(state.get('last_sent_at'))}" if state.get("last_sent_at") else "")
              + (f" ({state['unsent_reason']})" if state.get("unsent_reason") else ""))
