"""The `iceberg_catalog` connection: the Iceberg catalog a publish writes to, its secret kept
in the connection (never in DAG code or on a command line)."""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException

from airflow_upsert_provider.engine.errors import ConfigurationError

DEFAULT_ICEBERG_CONN_ID = "iceberg_catalog_default"
ICEBERG_CONN_TYPE = "iceberg_catalog"


class IcebergCatalogHook(BaseHook):
    """Reads an `iceberg_catalog` connection into PyIceberg catalog properties.

    The connection's extra holds PyIceberg catalog properties as they are: ``uri`` (a REST
    catalog's ``http[s]://`` URL, or a SQL catalog's ``sqlite:///`` / ``postgresql://``
    URL) and any other (``warehouse``, ``scope``, ``oauth2-server-uri``, ``header.*``,
    ``s3.*``, ...). Its password field holds the secret: a REST catalog's OAuth2 client secret
    (with the client id as login: PyIceberg's ``credential``) or bearer ``token`` (no login),
    or a SQL catalog's database password. The password is masked in Airflow's logs.

    :param iceberg_conn_id: id of the `iceberg_catalog` connection.
    """

    conn_name_attr = "iceberg_conn_id"
    default_conn_name = DEFAULT_ICEBERG_CONN_ID
    conn_type = ICEBERG_CONN_TYPE
    hook_name = "Iceberg catalog"

    def __init__(self, iceberg_conn_id: str = DEFAULT_ICEBERG_CONN_ID) -> None:
        super().__init__()
        self.iceberg_conn_id = iceberg_conn_id

    def catalog_properties(self, consensus_url: str, blob_root: str) -> dict[str, str]:
        """PyIceberg's properties of the connection's catalog (the default warehouse of a SQL
        catalog under ``blob_root``), the password included: never log them."""
        from airflow_upsert_provider.engine.maintenance.iceberg_catalog import connection_catalog_properties

        conn = self._connection()
        if conn.password:
            from airflow.sdk.log import mask_secret

            mask_secret(conn.password)
        return connection_catalog_properties(
            consensus_url, blob_root, conn.extra_dejson, login=conn.login or None, password=conn.password or None,
            connection=f"Airflow connection {self.iceberg_conn_id!r}",
        )

    def _connection(self) -> Any:
        try:
            conn = self.get_connection(self.iceberg_conn_id)
        except AirflowNotFoundException:
            raise ConfigurationError(
                f"Airflow connection {self.iceberg_conn_id!r} is not defined (create it with conn type "
                f"{ICEBERG_CONN_TYPE!r})",
                field="iceberg_conn_id",
            ) from None
        if conn.conn_type != ICEBERG_CONN_TYPE:
            raise ConfigurationError(
                f"Airflow connection {self.iceberg_conn_id!r} has type {conn.conn_type!r}; expected "
                f"{ICEBERG_CONN_TYPE!r}",
                field="iceberg_conn_id",
            )
        return conn
