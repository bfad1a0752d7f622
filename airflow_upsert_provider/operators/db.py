"""The consensus store's schema upgrade as a task (docs/upgrading.md): `upsertctl db upgrade`
through the `upsert` connection, whose password stays in the connection instead of on a
command line.

Thin: the engine's ``migrations.upgrade`` does the work; engine errors are mapped by
``to_airflow_error`` on their ``retryable`` flag.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from airflow_upsert_provider.engine.errors import UpsertError
from airflow_upsert_provider.hooks.upsert import DEFAULT_CONN_ID, UpsertShardHook
from airflow_upsert_provider.operators.errors import to_airflow_error

if TYPE_CHECKING:
    from airflow.sdk import Context


class UpgradeConsensusSchemaOperator(BaseOperator):
    """Migrate the `upsert` connection's consensus store to this provider's schema revision,
    as ``upsertctl db upgrade`` does: all migrations in one transaction under a lock,
    idempotent (a store at the head is left as it is). Stop the store's writers first
    (docs/upgrading.md). Returns ``from_revision``, ``to_revision`` and ``upgraded``.

    :param upsert_conn_id: the `upsert` connection of the store.
    """

    template_fields = ()
    ui_color = "#e8e2f4"

    def __init__(self, *, upsert_conn_id: str = DEFAULT_CONN_ID, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.upsert_conn_id = upsert_conn_id

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow_upsert_provider.engine.store import migrations
        from airflow_upsert_provider.engine.store.registry import open_consensus

        hook = UpsertShardHook(upsert_conn_id=self.upsert_conn_id)
        try:
            settings = hook.settings
            # Whatever the store's revision: this is the step that acts on a store others refuse.
            consensus = open_consensus(settings.consensus_url, create=False, check_schema=False)
            try:
                result = migrations.upgrade(consensus).to_dict()
            finally:
                consensus.dispose()
        except UpsertError as exc:
            raise to_airflow_error(exc) from None
        finally:
            hook.close()
        self.log.info("consensus store %s: schema revision %s -> %s (%s)", settings.redacted_consensus_url,
                      result["from_revision"] or "none", result["to_revision"],
                      "upgraded" if result["upgraded"] else "nothing to do")
        return result
