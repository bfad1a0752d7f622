"""``--conn-id CONN``: the consensus URL and the blob root of an Airflow `upsert` connection, so
that a password never has to be on a command line (``ps`` shows argv to every user). Airflow
is imported only when the option is given."""

from __future__ import annotations

import argparse
import logging

from airflow_upsert_provider.engine.errors import ConfigurationError


def apply_connection(args: argparse.Namespace) -> None:
    """Set ``args.consensus`` and ``args.blob_root`` from the connection ``args.conn_id``
    (nothing when it is not given), as if they were given on the command line, and give this
    process (and the processes it starts) the credentials of the connection's
    ``aws_conn_id``. A connection that is not defined, or not of type upsert, and
    ``--consensus`` or ``--blob-root`` beside it, are a :class:`ConfigurationError` naming
    ``conn_id``."""
    conn_id = getattr(args, "conn_id", None)
    if conn_id is None:
        return
    given = [flag for flag, name in (("--consensus", "consensus"), ("--blob-root", "blob_root")) if hasattr(args, name)]
    if given:
        raise ConfigurationError(f"--conn-id gives the consensus store and the blob root: {given[0]} cannot be given "
                                 "beside it", field="conn_id")
    # Importing Airflow configures logging for its own processes (every library's records to
    # stdout): this command's output stays its own.
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        from airflow.sdk.exceptions import AirflowNotFoundException

        from airflow_upsert_provider.hooks.upsert import UpsertShardHook
    except ImportError:
        raise ConfigurationError("--conn-id reads an Airflow connection, and Airflow is not installed here: give "
                                 "the store through UPSERT_CONSENSUS_URL and UPSERT_BLOB_ROOT instead",
                                 field="conn_id") from None
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    hook = UpsertShardHook(upsert_conn_id=conn_id)
    try:
        hook.get_connection(conn_id)  # the hook's embedded defaults are for tasks, not for a named connection
    except AirflowNotFoundException:
        raise ConfigurationError(f"Airflow connection {conn_id!r} is not defined (AIRFLOW_CONN_{conn_id.upper()}, a "
                                 "secrets backend or Airflow's metadata database; conn type 'upsert')",
                                 field="conn_id") from None
    settings = hook.settings
    args.consensus = settings.consensus_url
    args.blob_root = settings.blob_root
    credentials = hook.get_s3_credentials()
    if credentials is not None:
        from airflow_upsert_provider.engine.blob.filesystems import export_s3_credentials

        export_s3_credentials(credentials)  # this process only, and the processes it starts
