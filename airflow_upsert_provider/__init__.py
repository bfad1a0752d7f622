"""airflow-upsert-provider: safe micro-batch upserts on Spark for Apache Airflow."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

# The distribution name: Airflow's providers manager requires `package-name` to equal it.
DISTRIBUTION_NAME = "airflow-upsert-provider"
INTEGRATION_NAME = "Upsert shards"

# The table read without Spark (engine/table/arrow_reader.py), exported lazily: importing the
# package imports neither pyarrow nor PySpark.
_LAZY_EXPORTS = {
    "read_table": "airflow_upsert_provider.engine.table.arrow_reader",
    "read_table_from_store": "airflow_upsert_provider.engine.table.arrow_reader",
}


def __getattr__(name: str) -> Any:
    module = _LAZY_EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


def get_provider_info() -> dict[str, Any]:
    """Provider metadata, read by Airflow through the ``apache_airflow_provider`` entry point.

    The connection form is declared here (``conn-fields``, ``ui-field-behaviour``) so that
    Airflow renders it without importing the hook.
    """
    return {
        "package-name": DISTRIBUTION_NAME,
        "name": "Upsert",
        "description": "Safe micro-batch upserts on Apache Spark into keyed tables with a durable "
        "frontier (compare-and-append, converging writers).",
        "versions": [__version__],
        "integrations": [
            {
                "integration-name": INTEGRATION_NAME,
                "external-doc-url": "https://spark.apache.org/docs/latest/api/python/",
                "tags": ["software"],
            }
        ],
        "hooks": [
            {
                "integration-name": INTEGRATION_NAME,
                "python-modules": ["airflow_upsert_provider.hooks.upsert", "airflow_upsert_provider.hooks.iceberg"],
            }
        ],
        "operators": [
            {
                "integration-name": INTEGRATION_NAME,
                "python-modules": [
                    "airflow_upsert_provider.operators.upsert",
                    "airflow_upsert_provider.operators.maintenance",
                    "airflow_upsert_provider.operators.lifecycle",
                    "airflow_upsert_provider.operators.db",
                ],
            }
        ],
        "sensors": [
            {
                "integration-name": INTEGRATION_NAME,
                "python-modules": ["airflow_upsert_provider.sensors.frontier"],
            }
        ],
        "triggers": [
            {
                "integration-name": INTEGRATION_NAME,
                "python-modules": ["airflow_upsert_provider.triggers.frontier"],
            }
        ],
        "notifications": ["airflow_upsert_provider.notifications.frontier.FrontierPageNotifier"],
        # A shard's Asset, upsert://<upsert connection id>/<shard id>: Airflow normalizes every
        # URI of the scheme through the handler, which refuses one that names no shard.
        "asset-uris": [
            {"schemes": ["upsert"], "handler": "airflow_upsert_provider.assets.normalize_shard_uri"},
        ],
        # The operators' and sensor's "Shard page" button (operator_extra_links).
        "extra-links": ["airflow_upsert_provider.links.ShardPageLink"],
        # Loaded from here only while [core] lazy_discover_providers is false: the same plugin is
        # also an airflow.plugins entry point (pyproject.toml), which Airflow always loads.
        "plugins": [
            {"name": "upsert_provider_ui", "plugin-class": "airflow_upsert_provider.plugins.ui.UpsertProviderUiPlugin"},
        ],
        # What each optional extra of the distribution adds (pip install 'airflow-upsert-provider[X]');
        # the requirements are pyproject.toml's. Not read by Airflow: for tools and people.
        "optional-dependencies": {
            "openlineage": "OpenLineage events of every operator (docs/lineage.md)",
            "statsd": "metrics to StatsD (docs/metrics.md)",
            "s3": "blob roots on S3 with an Airflow aws connection's credentials (docs/storage.md)",
        },
        "connection-types": [
            {
                "hook-class-name": "airflow_upsert_provider.hooks.upsert.UpsertShardHook",
                "hook-name": "Upsert shard store",
                "connection-type": "upsert",
                "ui-field-behaviour": {
                    # The consensus URL names host, port, user and database itself; only its
                    # password is kept apart, in the masked password field.
                    "hidden-fields": ["host", "port", "schema", "login", "extra"],
                    "relabeling": {"password": "Consensus password (PostgreSQL)"},
                    # Airflow 3.3 renders no placeholder for an extra field: each one's examples
                    # live in its schema (the form offers them as suggestions).
                },
                "conn-fields": {
                    "consensus_url": {
                        "label": "Consensus URL",
                        "description": "sqlite:///PATH (one machine) or postgresql://USER@HOST:PORT/DB "
                        "(shared); put the password in the password field, not in the URL. "
                        "Default: sqlite:///$AIRFLOW_HOME/upsert/consensus.db",
                        "schema": {
                            "type": ["string", "null"],
                            "examples": [
                                "sqlite:////var/lib/upsert/consensus.db",
                                "postgresql://upsert@db.example.com:5432/upsert",
                            ],
                        },
                    },
                    "blob_root": {
                        "label": "Blob root",
                        "description": "Where runs and checkpoints live, reached by every Spark executor: "
                        "a shared directory, or s3://BUCKET/PREFIX (docs/storage.md). "
                        "Default: $AIRFLOW_HOME/upsert/blob",
                        "schema": {"type": ["string", "null"], "examples": ["/shared/upsert/blob"]},
                    },
                    "spark_conn_id": {
                        "label": "Spark connection id",
                        "description": "Spark connection giving the master; local[*] when it does "
                        "not exist.",
                        "schema": {"type": ["string", "null"], "default": "spark_default", "examples": ["spark_default"]},
                    },
                    "default_buckets": {
                        "label": "Buckets of new shards",
                        "description": "Hash buckets a new shard's runs are split into: 1 to 4096.",
                        # No minimum/maximum here: Airflow's form clamps a number into them
                        # silently (-3 saved as 1); the hook refuses it at use, naming the field.
                        "schema": {"type": ["integer", "null"], "default": 8},
                    },
                    "default_max_files_per_batch": {
                        "label": "Max files per batch of new shards",
                        "description": "How many source segment files one batch of a new shard binds: "
                        "at least 1.",
                        "schema": {"type": ["integer", "null"], "default": 64},
                    },
                    "kafka_conn_id": {
                        "label": "Kafka connection id",
                        "description": "Airflow connection of type kafka whose extra is the client "
                        "config (bootstrap.servers required) of Kafka shards, unless a task names "
                        "another.",
                        "schema": {"type": ["string", "null"], "examples": ["kafka_default"]},
                    },
                    "aws_conn_id": {
                        "label": "AWS connection id",
                        "description": "Airflow connection of type aws (the Amazon provider: "
                        "pip install airflow-upsert-provider[s3]) whose credentials, region and "
                        "endpoint_url reach a blob root on s3://. Blank: the standard AWS credential "
                        "chain of each machine (docs/storage.md).",
                        "schema": {"type": ["string", "null"], "examples": ["aws_default"]},
                    },
                },
            },
            {
                # The catalog PublishIcebergOperator(iceberg_conn_id=...) writes to: its secret
                # stays here, never in DAG code (docs/readers.md, "Iceberg").
                "hook-class-name": "airflow_upsert_provider.hooks.iceberg.IcebergCatalogHook",
                "hook-name": "Iceberg catalog",
                "connection-type": "iceberg_catalog",
                "ui-field-behaviour": {
                    "hidden-fields": ["host", "port", "schema"],
                    "relabeling": {
                        "login": "Client id (REST catalog, OAuth2)",
                        "password": "Secret: client secret or token (REST), or database password (SQL)",
                        "extra": "PyIceberg catalog properties (JSON): uri required",
                    },
                },
            },
        ],
    }
