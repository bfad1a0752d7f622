"""The lineage tests run Airflow through the Airflow tests' shared home."""

from tests.airflow.conftest import airflow_home  # noqa: F401 - the fixture, shared
