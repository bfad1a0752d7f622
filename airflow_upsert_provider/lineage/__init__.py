"""OpenLineage for the operators: what each one read and wrote, named by the conventions.

Three parts, so that the rules are pure and the effects thin:

- naming and description (pure, ``lineage/rules.py``): a directory source is a dataset of its filesystem
  (``file://HOST`` and the path, ``s3://BUCKET`` and the key), a Kafka topic one of
  ``kafka://BOOTSTRAP``, the shard one of its blob root's filesystem named by the shard's
  directory (``<blob root>/<shard id>``), a checkpoint its directory under the shard's, an
  Iceberg table one of its catalog (the catalog URI without credentials) named
  ``NAMESPACE.TABLE``. :func:`describe` turns what a task captured into datasets and facets as
  plain data (:class:`Lineage`);
- capture (effects, in the task's own process): :func:`capture` reads the shard's config,
  frontier and stream once the task's work is done, only when the OpenLineage provider is
  installed and enabled. The listener asks for facets in a forked process that shares the
  task's connection to its supervisor: nothing there may look up a connection or open a store,
  so everything is captured before;
- :func:`operator_lineage`: the provider's ``OperatorLineage`` of a captured task
  (``lineage/facets.py``, imported only then).

Without the provider nothing here imports it: :func:`lineage_enabled` is False and nothing
is captured.
"""

from __future__ import annotations

import logging
import socket
from typing import TYPE_CHECKING, Any, Mapping

from airflow_upsert_provider.lineage.rules import (
    KINDS_BY_OPERATOR,
    OWN_COMMITS,
    PUBLISH,
    RESTORE,
    UPSERT,
    Captured,
    ShardFacts,
    catalog_namespace,
    describe,
    schema_fields,
)

if TYPE_CHECKING:
    from airflow_upsert_provider.engine.table.shard import Shard
    from airflow_upsert_provider.hooks.upsert import UpsertShardHook

log = logging.getLogger(__name__)


# -- capture (effects, in the task's process) ------------------------------------------------


def lineage_enabled() -> bool:
    """Whether the OpenLineage provider is installed and not disabled (it is disabled when no
    transport is configured). Imports nothing of it when it is absent."""
    try:
        from airflow.providers.openlineage import conf
    except ImportError:
        return False
    return not conf.is_disabled()


def shard_facts(hook: UpsertShardHook, shard: Shard) -> ShardFacts:
    """Read what lineage needs of an open shard: config, frontier and stream status."""
    from airflow_upsert_provider.engine.errors import ConfigurationError
    from airflow_upsert_provider.engine.sources.kafka import KafkaSource
    from airflow_upsert_provider.engine.store.streams import read_stream

    state = shard.state()
    bootstrap = None
    if isinstance(shard.source, KafkaSource):
        try:
            bootstrap = shard.source.config.bootstrap_servers
        except ConfigurationError:
            pass  # opened without a client config: the topic is not named (source_dataset)
    return ShardFacts(
        shard=shard.shard_id, blob_root=hook.settings.blob_root, host=socket.getfqdn(), source=shard.config.source,
        kafka_bootstrap=bootstrap, fields=tuple(schema_fields(shard.config.schema)), upper=state.upper,
        since=state.since, status=read_stream(shard.consensus, shard.shard_id).status.value,
    )


def capture(operator: Any, hook: UpsertShardHook, result: Mapping[str, Any], *, shard: Shard | None = None,
            **extra: Any) -> Captured | None:
    """What ``operator``'s lineage needs, read after its work (``shard``: the one it opened,
    else its shard is opened); None when lineage is off, and when reading fails (logged): a
    lineage read never fails a task."""
    # A DAG's subclass of an operator reports as the operator does.
    kind = next((KINDS_BY_OPERATOR[c.__name__] for c in type(operator).__mro__ if c.__name__ in KINDS_BY_OPERATOR),
                None)
    if kind is None:
        return None
    try:
        if not lineage_enabled():
            return None
        if kind == RESTORE:
            extra["from_shard"] = operator.shard
            shard = hook.open_shard(str(result["shard"]))
        elif shard is None:
            shard = hook.open_shard(operator.shard)
        if kind == PUBLISH:
            extra["table_namespace"] = catalog_namespace(_catalog_uri(operator, hook))
        return Captured(kind, shard_facts(hook, shard), dict(result), extra)
    except Exception as exc:  # noqa: BLE001 - lineage is best effort; the task's own work is done
        from airflow_upsert_provider.engine.errors import first_line

        log.warning("OpenLineage: the lineage of shard %s was not read: %s: %s", operator.shard,
                    type(exc).__name__, first_line(str(exc)))
        return None


def _catalog_uri(operator: Any, hook: UpsertShardHook) -> str:
    """The URI of the catalog a publish wrote to (its credentials are cut by the caller)."""
    if operator.iceberg_conn_id:
        from airflow_upsert_provider.hooks.iceberg import IcebergCatalogHook

        properties = IcebergCatalogHook(operator.iceberg_conn_id).catalog_properties(
            hook.settings.consensus_url, hook.settings.blob_root)
        return str(properties.get("uri") or "")
    from airflow_upsert_provider.engine.maintenance.iceberg_catalog import catalog_properties

    return catalog_properties(hook.settings.consensus_url, hook.settings.blob_root, operator.catalog_uri or None)["uri"]


def operator_lineage(captured: Captured | None) -> Any:
    """The provider's ``OperatorLineage`` of a captured task; None when nothing was captured
    (the listener then reports the task without datasets)."""
    if captured is None:
        return None
    from airflow_upsert_provider.lineage.facets import to_operator_lineage

    return to_operator_lineage(describe(captured))


def parent_job_spark_conf(conf: dict[str, str], context: Mapping[str, Any]) -> dict[str, str]:
    """``conf`` with the OpenLineage parent-job properties (``spark.openlineage.parent*``,
    ``rootParent*``) the Spark provider's ``SparkSubmitOperator`` injects, when
    ``[openlineage] spark_inject_parent_job_info`` is on: an OpenLineage Spark listener in the
    job then names the task as its parent. Properties the user set win. Transport information
    is never injected: it may hold an API key, which would reach spark-submit's command line."""
    from airflow.configuration import conf as airflow_conf

    try:
        if not airflow_conf.getboolean("openlineage", "spark_inject_parent_job_info", fallback=False):
            return conf
        if not lineage_enabled():
            return conf
        from airflow.providers.common.compat.openlineage.utils.spark import (
            inject_parent_job_information_into_spark_properties,
        )

        return inject_parent_job_information_into_spark_properties(dict(conf), context)
    except Exception as exc:  # noqa: BLE001 - lineage is best effort: the job runs without its parent
        from airflow_upsert_provider.engine.errors import first_line

        log.warning("OpenLineage: no parent job information for the Spark job: %s: %s", type(exc).__name__,
                    first_line(str(exc)))
        return conf
