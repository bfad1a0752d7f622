"""The `upsert` connection type and the hook that turns it into engine objects.

The hook holds no engine logic: it reads the connection, builds the consensus store, the blob
store, shards and the SparkSession, and keeps secrets out of logs and messages.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException

from airflow_upsert_provider.engine.store.urls import with_password
from airflow_upsert_provider.engine.errors import ConfigurationError, UpsertError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from airflow_upsert_provider.engine.blob.filesystems import S3Credentials
    from airflow_upsert_provider.engine.blob.interface import Blob
    from airflow_upsert_provider.engine.store.consensus import Consensus
    from airflow_upsert_provider.engine.table.shard import Shard
    from airflow_upsert_provider.engine.sources.kafka import KafkaConfig

DEFAULT_CONN_ID = "upsert_default"
DEFAULT_SPARK_CONN_ID = "spark_default"
DEFAULT_SPARK_MASTER = "local[*]"


def airflow_home() -> str:
    return os.environ.get("AIRFLOW_HOME") or os.path.expanduser("~/airflow")


def embedded_consensus_url() -> str:
    return f"sqlite:///{os.path.join(airflow_home(), 'upsert', 'consensus.db')}"


def embedded_blob_root() -> str:
    return os.path.join(airflow_home(), "upsert", "blob")


@dataclass(frozen=True)
class UpsertSettings:
    """What an `upsert` connection says. ``consensus_url`` may hold a password: never log
    it, use :attr:`redacted_consensus_url`."""

    consensus_url: str
    blob_root: str
    spark_conn_id: str
    default_buckets: int | None
    default_max_files_per_batch: int | None
    # The Airflow `kafka` connection of Kafka shards opened without one named by the task.
    kafka_conn_id: str | None = None
    # The Amazon provider's `aws` connection whose credentials reach a blob root on S3.
    aws_conn_id: str | None = None

    @property
    def redacted_consensus_url(self) -> str:
        from airflow_upsert_provider.engine.store.urls import redact_url

        return redact_url(self.consensus_url)


def _optional_int(extra: Mapping[str, Any], name: str, *, minimum: int | None = None) -> int | None:
    """An optional integer field of the connection's extra; a value below ``minimum`` is
    refused naming the field, never clamped into range."""
    value = extra.get(name)
    if value in (None, ""):
        return None
    try:
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise ValueError(value)
        number = int(value)
    except (TypeError, ValueError):
        raise ConfigurationError(f"connection field {name!r} must be an integer, got {value!r}", field=name) from None
    if minimum is not None and number < minimum:
        raise ConfigurationError(f"connection field {name!r} must be at least {minimum}, got {value!r}", field=name)
    return number


def _missing_sqlite_file(url: str) -> str | None:
    """The file of a SQLite consensus URL when it does not exist (opening would create it)."""
    from sqlalchemy.engine.url import make_url

    try:
        parsed = make_url(url)
    except Exception:
        return None  # open_consensus refuses it with its own message
    if parsed.get_backend_name() != "sqlite" or not parsed.database or parsed.database == ":memory:":
        return None
    return None if os.path.exists(parsed.database) else parsed.database


class UpsertShardHook(BaseHook):
    """Builds the engine's objects from an `upsert` connection.

    Connection fields (declared in the provider info, stored in the connection's extra):
    ``consensus_url`` (``sqlite:///PATH`` or ``postgresql://USER@HOST:PORT/DB``; its password
    goes in the connection's password field), ``blob_root`` (a local path, or
    ``s3://BUCKET/PREFIX``: docs/storage.md), ``spark_conn_id`` (default ``spark_default``),
    ``default_buckets`` and ``default_max_files_per_batch`` (for shards
    created through :meth:`create_shard`), ``kafka_conn_id`` (the Airflow ``kafka`` connection
    whose extra is the client config of Kafka shards, unless a task names another),
    ``aws_conn_id`` (the Amazon provider's ``aws`` connection whose credentials, region and
    endpoint reach a blob root on S3: :meth:`get_s3_credentials`).

    When the connection ``upsert_default`` is not defined the embedded defaults apply: SQLite
    consensus at ``$AIRFLOW_HOME/upsert/consensus.db``, blob at ``$AIRFLOW_HOME/upsert/blob``.
    When the Spark connection is not defined, Spark runs ``local[*]``.

    API for operators: :meth:`get_consensus`, :meth:`get_blob`, :meth:`open_shard`,
    :meth:`create_shard`, :meth:`spark_master`, :meth:`get_spark`, :meth:`close`.

    :param upsert_conn_id: id of the `upsert` connection.
    """

    conn_name_attr = "upsert_conn_id"
    default_conn_name = DEFAULT_CONN_ID
    conn_type = "upsert"
    hook_name = "Upsert shard store"

    def __init__(self, upsert_conn_id: str = DEFAULT_CONN_ID) -> None:
        super().__init__()
        self.upsert_conn_id = upsert_conn_id
        self._settings: UpsertSettings | None = None
        self._consensus: Consensus | None = None
        self._blob: Blob | None = None
        # The aws connection's credentials, read once per hook (None: none named, or the root
        # is not on S3); _aws_read says whether they were read.
        self._aws_credentials: S3Credentials | None = None
        self._aws_read = False

    # -- connection --------------------------------------------------------------------------

    @property
    def settings(self) -> UpsertSettings:
        if self._settings is None:
            self._settings = self._read_settings()
        return self._settings

    def _read_settings(self) -> UpsertSettings:
        try:
            conn = self.get_connection(self.upsert_conn_id)
        except AirflowNotFoundException:
            if self.upsert_conn_id != DEFAULT_CONN_ID:
                raise ConfigurationError(
                    f"Airflow connection {self.upsert_conn_id!r} is not defined "
                    "(create it with conn type 'upsert')",
                    field="upsert_conn_id",
                ) from None
            self.log.info("connection %r is not defined: using the embedded defaults", DEFAULT_CONN_ID)
            return UpsertSettings(embedded_consensus_url(), embedded_blob_root(), DEFAULT_SPARK_CONN_ID, None, None,
                                  None)
        if conn.conn_type not in (None, "", "upsert"):
            raise ConfigurationError(
                f"Airflow connection {self.upsert_conn_id!r} has type {conn.conn_type!r}; expected 'upsert'",
                field="upsert_conn_id",
            )
        extra = conn.extra_dejson
        url = extra.get("consensus_url") or embedded_consensus_url()
        blob_root = extra.get("blob_root") or embedded_blob_root()
        # A local path or a supported store's URI: anything else is refused here, naming the
        # value, before a task opens the store or starts Spark.
        from airflow_upsert_provider.engine.blob.filesystems import split_uri

        split_uri(blob_root)
        self._mask(conn.password)
        self._mask_url_password(url)
        return UpsertSettings(
            consensus_url=with_password(url, conn.password),
            blob_root=blob_root,
            spark_conn_id=extra.get("spark_conn_id") or DEFAULT_SPARK_CONN_ID,
            default_buckets=_optional_int(extra, "default_buckets", minimum=1),
            default_max_files_per_batch=_optional_int(extra, "default_max_files_per_batch", minimum=1),
            kafka_conn_id=extra.get("kafka_conn_id") or None,
            aws_conn_id=extra.get("aws_conn_id") or None,
        )

    @staticmethod
    def _mask(secret: str | None) -> None:
        if secret:
            from airflow.sdk.log import mask_secret

            mask_secret(secret)

    def _mask_url_password(self, url: str) -> None:
        # A password written into the URL itself is a secret too.
        from sqlalchemy.engine.url import make_url

        try:
            self._mask(make_url(url).password)
        except Exception:
            pass

    def get_s3_credentials(self) -> S3Credentials | None:
        """The credentials, region and endpoint of the ``aws`` connection ``aws_conn_id`` as
        plain values, resolved by the Amazon provider's AWS hook (keys, session token, an
        assumed role, ``region_name`` and ``endpoint_url`` of its extra); None when no
        ``aws_conn_id`` is given or the blob root is not on S3. The secret and the token are
        masked in Airflow's logs before anything else is done with them. Without the Amazon
        provider (``pip install airflow-upsert-provider[s3]``) this is a configuration error
        saying so."""
        from airflow_upsert_provider.engine.blob.filesystems import S3Credentials, split_uri

        conn_id = self.settings.aws_conn_id
        if not conn_id or split_uri(self.settings.blob_root)[0] != "s3":
            return None
        try:
            from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook
        except ImportError:
            raise ConfigurationError(
                f"connection {self.upsert_conn_id!r} names the aws connection {conn_id!r} (aws_conn_id), which "
                "needs the Amazon provider: pip install 'airflow-upsert-provider[s3]' "
                "(or remove aws_conn_id to use the standard credential chain of this machine)",
                field="aws_conn_id",
            ) from None
        # The AWS hook would fall back to the machine's chain: a named connection must exist.
        conn = self._typed_connection(conn_id, "aws", "aws_conn_id",
                                      f"aws_conn_id of {self.upsert_conn_id!r}; create it with conn type 'aws'")
        self._mask(conn.password)
        aws = AwsBaseHook(aws_conn_id=conn_id, client_type="s3")
        try:
            frozen = aws.get_credentials()
        except Exception as exc:
            # Only the class: a botocore message may quote a request. botocore finds no
            # credentials at all as None, which get_credentials then dereferences.
            reason = "none found" if isinstance(exc, AttributeError) else type(exc).__name__
            raise ConfigurationError(
                f"the aws connection {conn_id!r} gives no credentials ({reason}); check its "
                "login/password, aws_session_token or role_arn (docs/storage.md)",
                field="aws_conn_id",
            ) from None
        self._mask(frozen.secret_key)
        self._mask(frozen.token)
        return S3Credentials(
            access_key_id=frozen.access_key,
            secret_access_key=frozen.secret_key,
            session_token=frozen.token or None,
            region=aws.conn_config.region_name or None,
            endpoint_url=aws.conn_config.get_service_endpoint_url("s3") or None,
        )

    def connection_s3_credentials(self) -> S3Credentials | None:
        """:meth:`get_s3_credentials`, read once per hook. They are given to the blob store's
        filesystem explicitly and to the child processes the task starts
        (:meth:`child_environment`), never put into this process's environment: a triggerer or
        an api-server runs the work of many connections in threads of one process."""
        if not self._aws_read:
            self._aws_credentials = self.get_s3_credentials()
            self._aws_read = True
            credentials = self._aws_credentials
            if credentials is not None:
                from airflow_upsert_provider.engine.blob.filesystems import display_uri

                self.log.info(
                    "blob root %s: credentials of the aws connection %r%s%s", self.settings.blob_root,
                    self.settings.aws_conn_id,
                    f", region {credentials.region}" if credentials.region else "",
                    f", endpoint {display_uri(credentials.endpoint_url)}" if credentials.endpoint_url else "",
                )
        return self._aws_credentials

    def child_environment(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment of a process this task starts (a local Spark JVM, ``spark-submit``):
        this process's, with ``extra`` and the aws connection's credentials as the standard
        variables (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``,
        ``AWS_REGION``, ``AWS_ENDPOINT_URL_S3``); never argv, never a Spark setting.

        :param extra: further variables of the child.
        """
        from airflow_upsert_provider.engine.blob.filesystems import child_environment

        return child_environment(self.connection_s3_credentials(), {**os.environ, **(extra or {})})

    def test_connection(self) -> tuple[bool, str]:
        """What the connection form's Test button shows: ``(True, "N shards found ...")`` when
        the consensus store opens (never created here: a missing SQLite file or a store
        without tables is reported, not made) and the blob root exists and takes a file (the
        probe file is deleted at once); ``(False, reason)`` otherwise. Neither says a secret:
        the URL is shown redacted and an unexpected error by its class only.

        Airflow 3.3 runs no provider code when a connection is saved (no save-time validation
        of connection fields): this is where a consensus URL it cannot use is refused.
        """
        from airflow_upsert_provider.engine.blob.files import open_blob
        from airflow_upsert_provider.engine.store.registry import open_consensus

        consensus: Consensus | None = None
        try:
            settings = self.settings
            where = settings.redacted_consensus_url
            missing = _missing_sqlite_file(settings.consensus_url)
            if missing is not None:
                return False, (f"consensus store {where}: the file {missing} does not exist (it is created by "
                               "`upsertctl init` or the first shard created through this connection)")
            consensus = open_consensus(settings.consensus_url, create=False)
            count = len(consensus.list_shards())
            open_blob(settings.blob_root, s3_credentials=self.connection_s3_credentials()).check_root()
        except UpsertError as exc:
            return False, exc.message
        except Exception as exc:  # a driver's message may quote the URL: the class only
            return False, f"{type(exc).__name__} while testing connection {self.upsert_conn_id!r}"
        finally:
            if consensus is not None:
                consensus.dispose()
            self.close()
        shards = "1 shard" if count == 1 else f"{count} shards"
        return True, f"{shards} found in {where}; blob root {settings.blob_root} is writable"

    def get_conn(self) -> Consensus:
        return self.get_consensus()

    # -- engine objects ----------------------------------------------------------------------

    def get_consensus(self) -> Consensus:
        """The consensus store (created at the schema's head revision if it has no tables).
        Raises ConsensusUnavailable when it cannot be reached, with the password masked, and
        SchemaVersionMismatch when its schema revision is not this provider's (docs/upgrading.md)."""
        if self._consensus is None:
            from airflow_upsert_provider.engine.store.registry import open_consensus

            self.log.info("consensus: %s", self.settings.redacted_consensus_url)
            self._consensus = open_consensus(self.settings.consensus_url)
        return self._consensus

    def get_blob(self, *, create: bool = False) -> Blob:
        """The blob store; its root must exist unless ``create``."""
        if self._blob is None:
            from airflow_upsert_provider.engine.blob.files import open_blob

            blob = open_blob(self.settings.blob_root, s3_credentials=self.connection_s3_credentials())
            if create:
                blob.ensure_root()
            blob.check_root()
            self._blob = blob
        return self._blob

    def open_shard(self, shard_id: str, *, kafka_conn_id: str | None = None, require_kafka_config: bool = False) -> Shard:
        """Open a shard. A Kafka shard gets its client config from the ``kafka`` connection
        ``kafka_conn_id`` (default: the upsert connection's ``kafka_conn_id``). Without
        either it opens without one (what reads consensus only still works; the first use of
        the broker says how to give one), or, with ``require_kafka_config``, is refused with a
        ConfigurationError saying so.

        :param shard_id: the shard.
        :param kafka_conn_id: the Airflow connection of type ``kafka`` for a Kafka shard;
            ignored for a directory shard.
        :param require_kafka_config: refuse a Kafka shard that no connection is named for.
        """
        from airflow_upsert_provider.engine.table.shard import Shard

        shard = Shard.open(self.get_consensus(), self.get_blob(), shard_id)
        if not shard.is_kafka:
            return shard
        conn_id = kafka_conn_id or self.settings.kafka_conn_id
        if not conn_id:
            if not require_kafka_config:
                return shard
            raise ConfigurationError(
                f"shard {shard_id!r} reads kafka topic {shard.source.topic!r} and no kafka connection is named: "
                f"pass kafka_conn_id to the operator, or set 'kafka_conn_id' in the extra of the upsert "
                f"connection {self.upsert_conn_id!r} (an Airflow connection of type 'kafka' whose extra holds "
                "the client config, bootstrap.servers required)",
                field="kafka_conn_id",
            )
        return Shard(shard.consensus, shard.blob, shard_id, shard.config, kafka_config=self.get_kafka_config(conn_id))

    def with_closest_shard(self, exc: UpsertError) -> UpsertError:
        """An unknown shard's error naming the store's closest existing shard (a typo in a
        param is the usual cause); ``exc`` unchanged otherwise, or when the store cannot list."""
        from airflow_upsert_provider.engine.common.names import with_closest_shard
        from airflow_upsert_provider.engine.errors import ShardNotFound

        if not isinstance(exc, ShardNotFound):
            return exc
        try:
            shard_ids = [record.shard_id for record in self.get_consensus().list_shards()]
        except Exception:  # the error in hand is what the user needs; the hint is a bonus
            return exc
        return with_closest_shard(exc, shard_ids)

    def get_kafka_config(self, kafka_conn_id: str) -> KafkaConfig:
        """The Kafka client config held by the Airflow connection ``kafka_conn_id`` (type
        ``kafka``, the Kafka provider's: its extra is the librdkafka properties). Every secret
        value in it is masked in Airflow's logs before anything else is done with it.

        :param kafka_conn_id: the connection id.
        """
        from airflow_upsert_provider.engine.sources.kafka import KafkaConfig

        conn = self._typed_connection(kafka_conn_id, "kafka", "kafka_conn_id",
                                      "create it with conn type 'kafka', its extra the client config")
        try:
            extra = conn.extra_dejson
        except Exception:  # never quote an extra: it holds the credentials
            raise ConfigurationError(
                f"Airflow connection {kafka_conn_id!r}: its extra is not a JSON object", field="kafka_conn_id"
            ) from None
        if isinstance(extra, Mapping):
            from airflow_upsert_provider.engine.sources.kafka import SECRET_NAME

            for name, value in extra.items():
                if isinstance(name, str) and SECRET_NAME.search(name) and value not in (None, ""):
                    self._mask(str(value))
        self._mask(conn.password)
        try:
            return KafkaConfig.from_dict(extra)
        except ConfigurationError as exc:
            raise ConfigurationError(f"Airflow connection {kafka_conn_id!r}: {exc.message}",
                                     field=exc.details.get("field", "kafka_conn_id")) from None

    def create_shard(
        self,
        shard_id: str,
        *,
        source: str,
        keys: tuple[str, ...] | list[str],
        schema_ddl: str,
        order_by: str | None = None,
        delete_marker: str | None = None,
        source_format: str = "jsonl",
        buckets: int | None = None,
        max_files_per_batch: int | None = None,
        target_bucket_bytes: int | None = None,
        schema_evolution: str | None = None,
    ) -> Shard:
        """Create a shard; buckets and files per batch default to the connection's defaults.

        :param target_bucket_bytes: a compaction that finds more than this per bucket below
            its since doubles the bucket count (default: the count stays as created).
        :param schema_evolution: which schema changes its batches make: ``none``,
            ``add_columns`` (default) or ``add_and_widen`` (docs/schema.md).
        """
        from airflow_upsert_provider.engine.config import (
            DEFAULT_BUCKETS,
            DEFAULT_MAX_FILES_PER_BATCH,
            ShardConfig,
        )
        from airflow_upsert_provider.engine.table.schema_apply import DEFAULT_POLICY, set_schema_policy
        from airflow_upsert_provider.engine.table.schema_evolution import check_policy
        from airflow_upsert_provider.engine.table.shard import Shard
        from airflow_upsert_provider.engine.write.upsert import parse_schema

        policy = check_policy(DEFAULT_POLICY if schema_evolution is None else schema_evolution)
        config = ShardConfig(
            source=source,
            keys=tuple(keys),
            schema=parse_schema(schema_ddl, self.get_spark),
            order_by=order_by,
            delete_marker=delete_marker,
            source_format=source_format,
            buckets=buckets or self.settings.default_buckets or DEFAULT_BUCKETS,
            max_files_per_batch=max_files_per_batch
            or self.settings.default_max_files_per_batch
            or DEFAULT_MAX_FILES_PER_BATCH,
            target_bucket_bytes=target_bucket_bytes,
        )
        shard = Shard.create(self.get_consensus(), self.get_blob(create=True), shard_id, config)
        set_schema_policy(shard, policy, f"hook:{self.upsert_conn_id}")
        return shard

    # -- Spark -------------------------------------------------------------------------------

    def spark_master(self) -> str:
        """The master of the Spark connection, ``local[*]`` when that connection is not defined.

        Resolved by the Spark provider's ``SparkSubmitHook`` itself, so a connection means the
        same master here as in ``submit`` mode (host, port, URI scheme). The provider exposes
        the resolved connection only as the hook's ``_connection`` mapping;
        ``tests/airflow/test_hook.py`` pins that contract for the supported provider range.
        """
        from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

        try:
            self.get_connection(self.settings.spark_conn_id)
        except AirflowNotFoundException:
            # The Spark provider would fall back to YARN; an embedded default runs locally.
            return DEFAULT_SPARK_MASTER
        # Private: no public API of the Spark provider gives the resolved master.
        return SparkSubmitHook(conn_id=self.settings.spark_conn_id)._connection["master"]

    def get_spark(self, app_name: str = "airflow-upsert-provider", conf: Mapping[str, str] | None = None) -> SparkSession:
        """A SparkSession in this process on the Spark connection's master (the active one
        if this process has one)."""
        from airflow_upsert_provider.engine.spark.session import get_spark

        # A JVM this starts (and its executors' Python workers) gets the credentials in its own
        # environment; a session already running in this process keeps the one it started with.
        environment = self.child_environment() if self.connection_s3_credentials() is not None else None
        return get_spark(self.spark_master(), app_name=app_name, conf=conf, environment=environment)

    def _typed_connection(self, conn_id: str, conn_type: str, field: str, hint: str) -> Any:
        """The Airflow connection ``conn_id``, which must exist and be of ``conn_type``; a
        :class:`ConfigurationError` on ``field`` otherwise (``hint``: how to make it)."""
        try:
            conn = self.get_connection(conn_id)
        except AirflowNotFoundException:
            raise ConfigurationError(f"Airflow connection {conn_id!r} is not defined ({hint})", field=field) from None
        if conn.conn_type != conn_type:
            raise ConfigurationError(
                f"Airflow connection {conn_id!r} has type {conn.conn_type!r}; {field} needs type {conn_type!r}",
                field=field,
            )
        return conn

    def close(self) -> None:
        if self._consensus is not None:
            self._consensus.dispose()
            self._consensus = None
