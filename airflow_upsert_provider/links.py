"""Links between Airflow's task views and the shard page, both ways.

``ShardPageLink`` is the "Shard page" button of the provider's operators and sensor: it opens
the shard page (``plugins/ui.py``) inside Airflow's UI at the task's shard. The task runner
computes it when the try ends (from the rendered ``shard`` and ``upsert_conn_id``) and keeps it
in XCom; the api-server only reads it back. The other way, the page links a batch's writer to
its task instance: ``task_instance_path`` reads the writer ids the upsert operator makes
(``operators.upsert.writer_id_for``).

Paths here are relative to the Airflow UI's root, so that they hold under a sub-path deployment.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode, urlsplit

from airflow.sdk import BaseOperatorLink

if TYPE_CHECKING:
    from airflow.models.taskinstancekey import TaskInstanceKey
    from airflow.sdk import BaseOperator

# Where the api-server serves the shard page, and the navigation route that frames it.
URL_PREFIX = "/upsert-provider-ui"
VIEW_ROUTE = "upsert-shards"
WRITER_ID_PREFIX = "airflow:"


def shard_page_path(conn_id: str, shard: str, root_path: str = "/") -> str:
    """The Airflow UI path (no leading slash) of the shard page framed in the UI and opened at
    ``shard`` of connection ``conn_id``. Airflow's plugin route loads the path after its own
    (``plugin/<route>/<path>``) into the frame: the page's path from the server's root, which
    includes the deployment's ``root_path``."""
    page = root_path.rstrip("/") + URL_PREFIX + "/"
    return f"plugin/{VIEW_ROUTE}{page}?{urlencode({'conn': conn_id, 'shard': shard})}"


def _base_url() -> str:
    from airflow.configuration import conf

    return conf.get("api", "base_url", fallback="") or ""


def shard_page_url(conn_id: str, shard: str, base_url: str | None = None) -> str:
    """The absolute URL of the shard page at ``shard`` (``[api] base_url``), or the path from
    the server's root when no base URL is configured."""
    base = _base_url() if base_url is None else base_url
    root_path = urlsplit(base).path or "/"
    if "://" not in base:
        return "/" + shard_page_path(conn_id, shard, root_path)
    return base.rstrip("/") + "/" + shard_page_path(conn_id, shard, root_path)


class ShardPageLink(BaseOperatorLink):
    """"Shard page": the shard page opened at the task's shard (a restore's target shard, when
    it has one: the shard the run made)."""

    name = "Shard page"

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        shard = getattr(operator, "target_shard", None) or getattr(operator, "shard", None)
        conn_id = getattr(operator, "upsert_conn_id", None)
        if not isinstance(shard, str) or not shard or not isinstance(conn_id, str) or "{{" in shard:
            return ""  # no rendered shard: Airflow shows no link
        return shard_page_url(conn_id, shard)


def parse_writer_id(writer_id: str | None) -> dict[str, Any] | None:
    """The task try of a writer id ``airflow:<dag_id>:<run_id>:<task_id>[:<map_index>]:try<N>``
    (``dag_id``, ``run_id``, ``task_id``, ``map_index``, ``try_number``); None for a writer
    that is not an Airflow task's (``upsertctl``, a test). Dag and task ids hold no ':'; a run
    id may."""
    if not writer_id or not writer_id.startswith(WRITER_ID_PREFIX):
        return None
    rest, _, try_number = writer_id[len(WRITER_ID_PREFIX):].rpartition(":try")
    dag_id, _, rest = rest.partition(":")
    if not (dag_id and rest and try_number.isdigit()):
        return None
    run_and_task, _, last = rest.rpartition(":")
    map_index = -1
    run_id, _, task_id = run_and_task.rpartition(":")
    if last.isdigit() and run_id and task_id:
        map_index = int(last)
    else:
        run_id, task_id = run_and_task, last
    if not (run_id and task_id):
        return None
    return {"dag_id": dag_id, "run_id": run_id, "task_id": task_id, "map_index": map_index,
            "try_number": int(try_number)}


def task_instance_path(writer_id: str | None) -> str | None:
    """The Airflow UI path (no leading slash) of the task try that ``writer_id`` names, as
    Airflow's own ``TaskInstance.log_url`` builds it; None for a writer that is not a task's."""
    ti = parse_writer_id(writer_id)
    if ti is None:
        return None
    mapped = f"/mapped/{ti['map_index']}" if ti["map_index"] >= 0 else ""
    return (f"dags/{quote(ti['dag_id'], safe='')}/runs/{quote(ti['run_id'], safe='')}/tasks/"
            f"{quote(ti['task_id'], safe='')}{mapped}?try_number={ti['try_number']}")


def dag_runs_path(dag_id: str) -> str:
    """The Airflow UI path of a DAG's runs."""
    return f"dags/{quote(dag_id, safe='')}/runs"


def asset_path(asset_id: int) -> str:
    """The Airflow UI path of an Asset (by its id in the metadata database)."""
    return f"assets/{int(asset_id)}"
