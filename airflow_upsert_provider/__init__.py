"""airflow-upsert-provider: safe micro-batch upserts on Spark for Apache Airflow."""

from __future__ import annotations

__version__ = "0.1.0"
