"""Watch every shard's frontier; page when one stalls, resolve when it moves again.

Every 15 minutes, `shards` lists the shards of the store (or takes the `shards` param), and one
`watch` sensor per shard (dynamic task mapping) evaluates its frontier once a minute for the
run's `watch_seconds` (14 minutes), in reschedule mode (no worker slot held between pokes).
Each poke records an observation and applies the stall rules ([docs/frontier.md](upsert-provider/docs/frontier)):

- STALLED (the source grew and the upper has not moved for max(stall_multiplier x cadence,
  min_stall)), REWOUND (the upper or a source went backwards) and STALE (nothing observed the
  shard) page after `consecutive_breaches` breaching pokes in a row: the page goes to PagerDuty
  and Slack, and the shard's `watch` task fails naming the shard, its upper, since when it has
  not moved, how far behind it is and the rule. While the incident lasts, later runs fail the
  task again without a second page.
- When the frontier moves again the page is resolved (same dedup key).
- IDLE (nothing new in the source) and STOPPED/RECOVERING streams (a person stopped them) do
  not page.

Beside the watches, `prune_history` deletes observations, stream history and alert rows older
than their retention ([docs/frontier.md, "Retention"](upsert-provider/docs/frontier#retention)), a bounded amount per run; its failure
fails that task alone.

A Kafka shard is observed with the client config of the `kafka_conn_id` param's connection
(blank: the `kafka_conn_id` in the upsert connection's extra); one that cannot be observed is
judged on what its writers record, its watch says why, and with nothing recorded it is STALE
and pages. Each shard has its own watch task: one that cannot be observed hides no other.

A watch whose evaluations keep failing (the store is down) pages that under the monitor's own
dedup key after `blind_page_seconds` (default: the stale limit) and resolves it when an
evaluation works again; when the store cannot even be listed, `shards` pages the same way on
its last try (once: later runs that cannot list it do not page again), and the next run that
lists the store resolves that page (kept meanwhile in an Airflow Variable named
`airflow-upsert-monitor-blind:<namespace>:`).

Connections: `upsert_default` (embedded defaults when it is not defined); the PagerDuty
(`pagerduty_events`, integration key in the password) and Slack (`slackwebhook`) connection
ids are params; left empty, the page is only logged and the task still fails.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from airflow.sdk import DAG, Param, task

from airflow_upsert_provider.engine.config import SHARD_ID_PATTERN
from airflow_upsert_provider.operators.params import number_param, optional_text_param
from airflow_upsert_provider.sensors.frontier import FrontierStallSensor

if TYPE_CHECKING:
    from airflow_upsert_provider.engine.frontier.blind import BlindState

# An Airflow connection id; empty (or null, the form's empty field) is none.
CONN_ID_PATTERN = r"^$|^[A-Za-z0-9_.-]{1,250}$"
# A name made of letters, digits, '_', '.' and '-'; empty (or null) is none.
NAMESPACE_PATTERN = r"^[A-Za-z0-9_.-]{0,64}$"

# Tries of listing the store before the monitor pages that it cannot (a minute apart).
LIST_RETRIES = 2


def open_blind_monitor_page(namespace: str) -> BlindState | None:
    """The monitor's own page an earlier run sent because the store could not be listed
    (frontier.blind's record, kept in an Airflow Variable: the store was what failed), or None."""
    import logging

    from airflow.sdk import Variable

    from airflow_upsert_provider.engine.frontier.blind import blind_record_key, parse_blind_record

    log = logging.getLogger(__name__)
    key = blind_record_key(namespace)
    try:
        text = Variable.get(key, default=None)
    except Exception as exc:  # noqa: BLE001 - a record that cannot be read costs a repeated page, not a lost one
        log.warning("Airflow Variable %r (the monitor's open page, if any) could not be read (%s: %s)",
                    key, type(exc).__name__, exc)
        return None
    if text is None:
        return None
    recorded, problem = parse_blind_record(text, f"Airflow Variable {key!r}")
    if problem:
        log.warning("%s", problem)
    return recorded


def page_blind_monitor(params: dict, exc: BaseException, *, since: float | None,
                       recorded: BlindState | None = None) -> None:
    """Send the monitor's own page (frontier.blind_page_event): the store cannot be listed.
    Once sent it is recorded (``recorded``: the page an earlier run sent, which is not sent
    again while the store stays unlisted), so that the next run that lists the store resolves it."""
    import logging
    import time

    from airflow.sdk import Variable

    from airflow_upsert_provider.engine.frontier.blind import (
        BlindState,
        advance_blind,
        blind_page_event,
        blind_record,
        blind_record_key,
    )
    from airflow_upsert_provider.notifications.frontier import send_page

    now = time.time()
    text = getattr(exc, "message", None) or (str(exc).splitlines() or [""])[0]
    error = f"{type(exc).__name__}: {text[:300]}"
    namespace = params.get("namespace") or ""
    # A run's last try pages at once (limit 0) unless an earlier run's page is still open.
    state, action = advance_blind(recorded or BlindState(since if since is not None else now), now, error, 0.0)
    log = logging.getLogger(__name__)
    if action is None:
        log.warning("the store still cannot be listed (%s); the monitor's page sent at %s stays open", error,
                    state.since)
        return
    event = blind_page_event(state, action, now, namespace=namespace)
    pagerduty, slack = params.get("pagerduty_conn_id") or None, params.get("slack_conn_id") or None
    if not (pagerduty or slack):
        log.warning("%s, but no PagerDuty or Slack connection is configured", event["summary"])
        return
    send_page(event, pagerduty_events_conn_id=pagerduty, slack_webhook_conn_id=slack)
    key = blind_record_key(namespace)
    try:
        Variable.set(key, blind_record(state), description="the frontier monitor's open 'monitor blind' page (the "
                     "store could not be listed): the next run that lists the store resolves it and deletes this")
    except Exception as exc:  # noqa: BLE001 - the page is sent; unrecorded, a later run sends it again
        log.warning("the monitor's page could not be recorded in Airflow Variable %r (%s: %s)", key,
                    type(exc).__name__, exc)


def resolve_blind_monitor(params: dict, recorded: BlindState | None) -> None:
    """The store was listed: resolve the monitor's page ``recorded`` (sent by an earlier run)
    and delete its record. A resolve that is not delivered keeps the record for the next run,
    and fails nothing: the watches must run."""
    import logging
    import time

    from airflow.sdk import Variable

    from airflow_upsert_provider.engine.frontier.blind import advance_blind, blind_page_event, blind_record_key
    from airflow_upsert_provider.notifications.frontier import send_page

    if recorded is None:
        return
    now = time.time()
    log = logging.getLogger(__name__)
    namespace = params.get("namespace") or ""
    _, action = advance_blind(recorded, now, None, 0.0)
    event = blind_page_event(recorded, action, now, namespace=namespace)
    pagerduty, slack = params.get("pagerduty_conn_id") or None, params.get("slack_conn_id") or None
    if pagerduty or slack:
        try:
            send_page(event, pagerduty_events_conn_id=pagerduty, slack_webhook_conn_id=slack)
        except Exception as exc:  # noqa: BLE001 - kept for the next run; the watches go on
            log.warning("%s: the resolve was NOT delivered (%s: %s); the next run that lists the store sends it",
                        event["summary"], type(exc).__name__, exc)
            return
    else:
        log.warning("%s, but no PagerDuty or Slack connection is configured", event["summary"])
    key = blind_record_key(namespace)
    try:
        Variable.delete(key)
    except Exception as exc:  # noqa: BLE001 - a record left behind costs one more resolve, not a lost page
        log.info("Airflow Variable %r was not deleted (%s: %s)", key, type(exc).__name__, exc)
    log.info("%s: resolve sent (dedup key %s)", event["summary"], event["dedup_key"])


with DAG(
    dag_id="upsert_frontier_monitor",
    description="Page when an upsert shard's frontier stalls, resolve when it moves again",
    schedule="*/15 * * * *",
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    # A failed watch is a page (or a shard that does not exist), not a fault to retry.
    default_args={"retries": 0},
    params={
        # Nullable: the form marks a non-null param required, and empty means every shard.
        "shards": Param(
            [], type=["null", "array"], items={"type": "string", "pattern": SHARD_ID_PATTERN.pattern}, title="Shards",
            description="Ids of the shards to watch; empty: every shard of the consensus store. A shard "
            "that does not exist fails its watch task, naming it.",
        ),
        "cadence_seconds": number_param(
            300, minimum=1, title="Batch cadence (seconds)",
            description="How often the shards' micro-batches are expected to run (the writer's schedule, "
            "e.g. 300 for upsert_microbatch every five minutes).",
        ),
        "stall_multiplier": number_param(
            3, minimum=1, title="Stall multiplier",
            description="A frontier is stalled when the source grew and its upper has not moved for "
            "max(stall_multiplier x cadence, min_stall_seconds).",
        ),
        "min_stall_seconds": number_param(
            900, minimum=0, title="Minimum stall (seconds)",
            description="The shortest stall that pages, whatever the cadence: one slow batch is not an "
            "incident.",
        ),
        "window_seconds": number_param(
            3600, minimum=60, title="Window (seconds)",
            description="How far back the rules look at observations; it must cover the stall threshold "
            "plus the stale limit (the run fails on start, naming the field, when it does not).",
        ),
        "consecutive_breaches": number_param(
            2, type="integer", minimum=1, maximum=100, title="Breaches before paging",
            description="How many breaching pokes in a row page: one noisy observation never pages.",
        ),
        "watch_seconds": number_param(
            840, type="integer", minimum=0, maximum=86400, title="Watch (seconds)",
            description="How long one run's watch of a shard lasts before it succeeds healthy (a poke "
            "every minute); 0: one evaluation. Keep it below the schedule's 15 minutes.",
        ),
        "namespace": optional_text_param(
            pattern=NAMESPACE_PATTERN, title="Namespace",
            description="Names this deployment in the pages' dedup key and group (e.g. prod-eu), so that "
            "two deployments with a shard of the same id page separately; empty: none.",
        ),
        "pagerduty_conn_id": optional_text_param(
            pattern=CONN_ID_PATTERN, title="PagerDuty connection",
            description="Id of a pagerduty_events connection whose password is the service's Events API "
            "v2 integration key; empty: no PagerDuty page.",
        ),
        "kafka_conn_id": optional_text_param(
            pattern=CONN_ID_PATTERN, title="Kafka connection",
            description="Id of a kafka connection whose extra is the client config of the Kafka shards' "
            "cluster; empty: the kafka_conn_id of the upsert connection's extra.",
        ),
        "slack_conn_id": optional_text_param(
            pattern=CONN_ID_PATTERN, title="Slack connection",
            description="Id of a slackwebhook connection whose password is the incoming webhook; empty: "
            "no Slack message.",
        ),
    },
    render_template_as_native_obj=True,
    tags=["upsert", "example", "frontier"],
    doc_md=__doc__,
) as dag:

    @task(retries=LIST_RETRIES, retry_delay=timedelta(minutes=1))
    def shards(params: dict | None = None, ti=None, dag_run=None) -> list[str]:
        """The shards to watch: the param, or every shard of the store. When the store cannot
        be listed on the last try, the monitor pages that under its own dedup key: with no
        shard listed, no watch would run to page anything."""
        from airflow_upsert_provider.hooks.upsert import UpsertShardHook

        params = params or {}
        chosen = list(params.get("shards") or [])
        if chosen:
            return chosen
        recorded = open_blind_monitor_page(params.get("namespace") or "")
        hook = UpsertShardHook()
        try:
            listed = [record.shard_id for record in hook.get_consensus().list_shards()]
        except Exception as exc:
            if ti is not None and ti.try_number > LIST_RETRIES:
                page_blind_monitor(params, exc, since=dag_run.start_date.timestamp() if dag_run else None,
                                   recorded=recorded)
            raise
        finally:
            hook.close()
        resolve_blind_monitor(params, recorded)
        return listed

    @task
    def prune_history() -> dict[str, int]:
        """Delete observations, stream history and alert rows older than their retention (docs/
        frontier.md, "Retention"), a bounded amount per run; beside the watches, so that a
        failure here fails this task alone and never holds a page up."""
        from airflow_upsert_provider.engine.frontier.history import prune_history as prune
        from airflow_upsert_provider.hooks.upsert import UpsertShardHook

        hook = UpsertShardHook()
        try:
            return prune(hook.get_consensus())
        finally:
            hook.close()

    prune_history()

    FrontierStallSensor.partial(
        task_id="watch",
        mode="reschedule",
        poke_interval=60,
        watch_seconds="{{ params.watch_seconds }}",
        cadence_seconds="{{ params.cadence_seconds }}",
        stall_multiplier="{{ params.stall_multiplier }}",
        min_stall_seconds="{{ params.min_stall_seconds }}",
        window_seconds="{{ params.window_seconds }}",
        consecutive_breaches="{{ params.consecutive_breaches }}",
        namespace="{{ params.namespace }}",
        pagerduty_events_conn_id="{{ params.pagerduty_conn_id }}",
        slack_webhook_conn_id="{{ params.slack_conn_id }}",
        kafka_conn_id="{{ params.kafka_conn_id }}",
        timeout=timedelta(minutes=20),
    ).expand(shard=shards())
