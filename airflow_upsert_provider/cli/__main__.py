"""``python -m airflow_upsert_provider.cli``: the ``upsertctl`` program."""

from airflow_upsert_provider.cli import run

run()
