"""The ``pyarrow.fs`` filesystem that holds a blob URI, in whatever process asks.

``filesystem_for`` is called on the driver and in Spark executors alike, so it builds
everything from the URI and the process's own environment: nothing is shipped from the driver
and no secret ever travels in a URI. Credentials come from the standard chain of the process
(``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` / ``AWS_SESSION_TOKEN``, the shared config
files, web identity, the instance profile; ``GOOGLE_APPLICATION_CREDENTIALS`` and the metadata
server for GCS; ``DefaultAzureCredential`` for Azure); an S3-compatible server is reached
through ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL`` the region comes from
``AWS_REGION`` / ``AWS_DEFAULT_REGION`` and the bound of retries from ``AWS_MAX_ATTEMPTS``.

Failed requests are retried by the filesystem layer itself, within a bound
(:data:`S3_MAX_ATTEMPTS` attempts on S3, :data:`GCS_RETRY_SECONDS` on GCS); nothing here loops
around it.

Credentials held elsewhere (an Airflow ``aws`` connection) are plain values,
:class:`S3Credentials`, given to :func:`filesystem_for` explicitly: this process's environment
is never changed (a triggerer or an api-server runs many connections' work in threads of one
process). Child processes a task starts (a local Spark session's JVM and its Python workers, a
``spark-submit``) get them in their own environment, :func:`child_environment`, so a secret
never has to travel in argv, a Spark setting or a query plan.

Filesystems are cached per process, keyed by the URI's scheme and authority (bucket, container,
namenode), the endpoint, region and retry bound and a digest of the credentials (those given,
else those the environment holds): building one resolves credentials, and an executor serves many tasks. A forked child (Spark's Python workers fork from a daemon)
never reuses its parent's clients, whose connections and threads did not survive the fork.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from airflow_upsert_provider.engine.errors import ConfigurationError, first_line

if TYPE_CHECKING:
    import pyarrow.fs

# Schemes of object stores and distributed filesystems (URIs of them are kept whole); a path
# without a scheme, or with ``file://``, is on the local filesystem.
OBJECT_SCHEMES = ("s3", "gs", "abfs", "abfss", "hdfs")

# Attempts of one S3 request (the first one included) before the error reaches the caller,
# unless ``AWS_MAX_ATTEMPTS`` (the AWS SDKs' own variable) says otherwise: enough to ride out a
# throttled or restarting endpoint; the standard strategy's backoff makes 5 attempts cost
# about 10 s against an endpoint where nothing listens.
S3_MAX_ATTEMPTS = 5
# GCS's client retries by time rather than by count.
GCS_RETRY_SECONDS = 30

_lock = threading.Lock()
_cache: dict[tuple[str, ...], "pyarrow.fs.FileSystem"] = {}
_cache_pid = os.getpid()


def split_uri(uri_or_path: str) -> tuple[str, str, str]:
    """(scheme, authority, path) of a blob location: ``("", "", "/abs/path")`` for a local
    path or ``file://`` URI, else the URI's scheme (lower case), authority and path (no
    leading ``/``). Refuses an unknown scheme, credentials in the URI (user information, also
    with a ``/`` in the secret, or pyarrow's ``?access_key=...&secret_key=...``: they would
    reach logs and ``ps``) and any query string (it would become part of every object key),
    naming the URI without them."""
    if "://" not in uri_or_path:
        return "", "", os.path.abspath(uri_or_path)
    scheme, rest = uri_or_path.split("://", 1)
    scheme = scheme.lower()
    if scheme == "file":
        # file:///abs/path and file://localhost/abs/path; a relative file:// is a local path too.
        if rest.startswith("localhost/"):
            rest = rest[len("localhost") :]
        return "", "", os.path.abspath(rest)
    shown = display_uri(uri_or_path)
    if scheme not in OBJECT_SCHEMES:
        raise ConfigurationError(
            f"blob root {shown!r} has the unsupported scheme {scheme!r}; "
            f"use a local path or one of {', '.join(s + '://' for s in OBJECT_SCHEMES)}",
            field="blob_root",
        )
    if _has_user_info(scheme, rest) or _query_names_credentials(rest):
        raise ConfigurationError(
            f"blob root {shown!r} carries credentials in the URI; give them through "
            "the environment or the connection instead (docs/storage.md)",
            field="blob_root",
        )
    if "?" in rest:
        raise ConfigurationError(
            f"blob root {shown!r} has a query string, which would become part of every object key; "
            "remove it (settings of the store go into the environment or the connection: docs/storage.md)",
            field="blob_root",
        )
    authority, _, path = rest.partition("/")
    if not authority:
        raise ConfigurationError(
            f"blob root {shown!r} names no bucket, container or host after {scheme}://",
            field="blob_root",
        )
    if scheme == "hdfs" and ":" in authority and not authority.rpartition(":")[2].isdigit():
        raise ConfigurationError(
            f"blob root {shown!r}: the namenode's port {authority.rpartition(':')[2]!r} is not a number "
            "(hdfs://NAMENODE:PORT/PATH)",
            field="blob_root",
        )
    return scheme, authority, path.strip("/")


# Names of pyarrow's URI query parameters (``FileSystem.from_uri``) and of the usual signed-URL
# parameters that carry a credential.
_CREDENTIAL_QUERY = re.compile(r"(?:^|[?&])[^=&]*(?:key|secret|token|signature|credential|password|sig)[^=&]*=",
                               re.IGNORECASE)


def _has_user_info(scheme: str, rest: str) -> bool:
    """Whether the part of a URI after ``scheme://`` starts with user information. An ``@``
    in the authority is one, except abfs's ``container@account``; so is a ``:`` in the first
    segment before a later ``@`` (a secret holding ``/`` splits the authority early), and any
    ``:`` in an S3 or GCS bucket name, which cannot hold one."""
    first, slash, tail = rest.partition("/")
    first = first.split("?", 1)[0]
    if "@" in first:
        user = first.rpartition("@")[0]
        return scheme not in ("abfs", "abfss") or ":" in user
    if ":" in first:
        return scheme in ("s3", "gs") or "@" in tail
    return False


def _query_names_credentials(rest: str) -> bool:
    query = rest.partition("?")[2]
    return bool(query) and _CREDENTIAL_QUERY.search("?" + query) is not None


def display_uri(uri: str) -> str:
    """``uri`` as a message may show it: any user information before the host is cut out
    (up to the URI's last ``@`` when the secret split the authority), and the query too."""
    if "://" not in uri:
        return uri
    scheme, rest = uri.split("://", 1)
    rest, question, _query = rest.partition("?")
    query = "?***" if question else ""
    if not _has_user_info(scheme.lower(), rest):
        return f"{scheme}://{rest}{query}"
    if "@" not in rest:
        return f"{scheme}://***{query}"
    return f"{scheme}://***@{rest.rpartition('@')[2]}{query}"


def s3_endpoint(credentials: "S3Credentials | None" = None) -> str | None:
    """The S3 endpoint ``credentials`` name, else the environment's (the service-specific
    variable first, as the AWS SDKs read them), or None for AWS itself."""
    if credentials is not None and credentials.endpoint_url:
        return credentials.endpoint_url
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None


def s3_region(credentials: "S3Credentials | None" = None) -> str | None:
    if credentials is not None and credentials.region:
        return credentials.region
    return os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or None


# The variables of the S3 credential chain that name who this process is: a change of any of
# them gives new filesystems (the cache never serves one built for other credentials).
S3_IDENTITY_VARIABLES = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                         "AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_SHARED_CREDENTIALS_FILE",
                         "AWS_CONFIG_FILE")


@dataclass(frozen=True)
class S3Credentials:
    """Credentials, region and endpoint of S3 as plain values (what an Airflow ``aws``
    connection resolves to). Its repr never shows the secret or the token."""

    access_key_id: str
    secret_access_key: str = field(repr=False)
    session_token: str | None = field(default=None, repr=False)
    region: str | None = None
    endpoint_url: str | None = None

    def environment(self) -> dict[str, str | None]:
        """The standard variables that carry these values; None: the variable is unset (a
        session token of other credentials must not be sent with these). A region or an
        endpoint left open keeps what the environment says, as the AWS SDKs do."""
        variables: dict[str, str | None] = {
            "AWS_ACCESS_KEY_ID": self.access_key_id,
            "AWS_SECRET_ACCESS_KEY": self.secret_access_key,
            "AWS_SESSION_TOKEN": self.session_token or None,
        }
        if self.region:
            variables["AWS_REGION"] = self.region
        if self.endpoint_url:
            # The S3-specific variable, read before AWS_ENDPOINT_URL (s3_endpoint).
            variables["AWS_ENDPOINT_URL_S3"] = self.endpoint_url
        return variables


def export_s3_credentials(credentials: S3Credentials) -> None:
    """Make ``credentials`` the S3 credential chain of this process and of every process it
    starts. Only for a process that serves one connection for its whole life (``upsertctl
    --conn-id``); a process that may run the work of several (a triggerer, an api-server, a
    task hook) gives them to :func:`filesystem_for` and :func:`child_environment` instead."""
    _set_variables(os.environ, credentials.environment())


def child_environment(credentials: S3Credentials | None,
                      base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a child process (``base``, default this process's) with
    ``credentials`` as its S3 credential chain: what a task gives the processes it starts,
    without changing its own environment."""
    environment = dict(os.environ if base is None else base)
    if credentials is not None:
        _set_variables(environment, credentials.environment())
    return environment


def _set_variables(environment: MutableMapping[str, str], variables: Mapping[str, str | None]) -> None:
    """Set each variable to its value in ``environment``, remove it where the value is None."""
    for name, value in variables.items():
        if value is None:
            environment.pop(name, None)
        else:
            environment[name] = value


def s3_identity(credentials: S3Credentials | None = None) -> str:
    """A digest of ``credentials``, else of the credential variables of this process: a cache
    key that changes with them and holds none of them."""
    if credentials is not None:
        text = "\0".join(["given", credentials.access_key_id, credentials.secret_access_key,
                           credentials.session_token or ""])
    else:
        text = "\0".join(os.environ.get(name, "") for name in S3_IDENTITY_VARIABLES)
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()


def s3_max_attempts() -> int:
    text = os.environ.get("AWS_MAX_ATTEMPTS")
    if not text:
        return S3_MAX_ATTEMPTS
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= 100:
        raise ConfigurationError(f"AWS_MAX_ATTEMPTS takes an integer from 1 to 100, not {text[:20]!r}",
                                 field="AWS_MAX_ATTEMPTS")
    return value


def filesystem_for(uri_or_path: str, credentials: S3Credentials | None = None) -> tuple["pyarrow.fs.FileSystem", str]:
    """The pyarrow filesystem that holds ``uri_or_path`` and the path inside it; on S3 signed
    with ``credentials`` (and at their endpoint and region) when given, else with the
    process's chain.

    A local path or ``file://`` URI gives ``LocalFileSystem`` and the absolute path;
    ``s3://bucket/key`` gives the S3 filesystem and ``bucket/key``; ``gs://bucket/key`` the GCS
    one and ``bucket/key``; ``abfs[s]://container@account.dfs.core.windows.net/key`` the Azure
    one and ``container/key``; ``hdfs://host:port/path`` the HDFS one and ``/path``."""
    scheme, authority, path = split_uri(uri_or_path)
    import pyarrow.fs as pafs

    if not scheme:
        return pafs.LocalFileSystem(), path
    if scheme == "s3":
        key: tuple[str, ...] = (scheme, authority, s3_endpoint(credentials) or "", s3_region(credentials) or "",
                                str(s3_max_attempts()), s3_identity(credentials),
                                os.environ.get("AWS_REQUEST_CHECKSUM_CALCULATION", ""))
    else:
        key = (scheme, authority)
    filesystem = _cached(key, lambda: _build(scheme, authority, uri_or_path, credentials))
    if scheme in ("s3", "gs"):
        inner = f"{authority}/{path}" if path else authority
    elif scheme in ("abfs", "abfss"):
        container = authority.split("@", 1)[0]
        inner = f"{container}/{path}" if path else container
    else:  # hdfs
        inner = f"/{path}"
    return filesystem, inner


def _cached(key: tuple[str, ...], build) -> "pyarrow.fs.FileSystem":
    global _cache_pid
    with _lock:
        if _cache_pid != os.getpid():
            _cache.clear()
            _cache_pid = os.getpid()
        filesystem = _cache.get(key)
        if filesystem is None:
            filesystem = _cache[key] = build()
        return filesystem


def _build(scheme: str, authority: str, uri: str, credentials: S3Credentials | None) -> "pyarrow.fs.FileSystem":
    """The filesystem of ``scheme://authority``; one that cannot be set up (a missing libjvm
    for HDFS, an endpoint that is no URL, Azure without credentials) is the
    :class:`ConfigurationError` of the root ``uri``, naming it and the reason."""
    import pyarrow.fs as pafs

    try:
        if scheme == "s3":
            return _s3(authority, credentials)
        if scheme == "gs":
            return pafs.GcsFileSystem(retry_time_limit=timedelta(seconds=GCS_RETRY_SECONDS))
        if scheme in ("abfs", "abfss"):
            # container@account.dfs.core.windows.net: the account is the host's first label.
            container, _, host = authority.rpartition("@")
            account = (host or authority).split(".", 1)[0]
            _probe_azure_credentials(account, container or authority, uri)
            return pafs.AzureFileSystem(account_name=account)
        host, _, port = authority.rpartition(":") if ":" in authority else (authority, "", "")
        return pafs.HadoopFileSystem(host, int(port) if port else 8020)
    except ConfigurationError:
        raise
    except Exception as exc:  # pyarrow raises OSError, ArrowException or ValueError here
        raise ConfigurationError(
            f"blob root {display_uri(uri)} cannot be used: its {scheme}:// filesystem cannot be set up: "
            f"{first_line(exc) or type(exc).__name__} (docs/storage.md)",
            field="blob_root",
        ) from None


# Time a probe of Azure's credential chain may take (it asks the managed identity endpoint and
# the Azure CLI in turn).
AZURE_PROBE_SECONDS = 120
_AZURE_PROBE = """
import sys
import pyarrow.fs as pafs
try:
    pafs.AzureFileSystem(account_name=sys.argv[1]).get_file_info(sys.argv[2])
except Exception:
    pass  # an error this process can catch is reported by the real request, mapped as usual
"""


def _probe_azure_credentials(account: str, container: str, uri: str) -> None:
    """Refuse an Azure root whose credential chain finds nothing. PyArrow's Azure filesystem
    takes ``DefaultAzureCredential``, whose failure to get a token is thrown where nothing
    catches it: it aborts the whole process (SIGABRT) at the first request. So that first
    request is made once in a child process; if that child dies of a signal, this process
    would have too."""
    import signal
    import subprocess
    import sys

    try:
        probe = subprocess.run([sys.executable, "-c", _AZURE_PROBE, account, container], capture_output=True,
                               text=True, timeout=AZURE_PROBE_SECONDS, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise ConfigurationError(
            f"blob root {display_uri(uri)} cannot be used: Azure's credential chain (DefaultAzureCredential) "
            f"gave no answer within {AZURE_PROBE_SECONDS} s; configure credentials (docs/storage.md)",
            field="blob_root",
        ) from None
    if probe.returncode >= 0:
        return
    said = [line.strip() for line in probe.stderr.splitlines() if "what():" in line]
    reason = said[-1].split("what():", 1)[1].strip()[:200] if said else "no message"
    raise ConfigurationError(
        f"blob root {display_uri(uri)} cannot be used: Azure's credential chain (DefaultAzureCredential) "
        f"found no credentials and aborted a probe process ({signal.Signals(-probe.returncode).name}: {reason}); "
        "configure them for this process: AZURE_TENANT_ID, AZURE_CLIENT_ID and AZURE_CLIENT_SECRET, "
        "workload identity, a managed identity or `az login` (docs/storage.md)",
        field="blob_root",
    )


def _s3(bucket: str, credentials: S3Credentials | None) -> "pyarrow.fs.FileSystem":
    import pyarrow.fs as pafs

    options: dict = {
        "retry_strategy": pafs.AwsStandardS3RetryStrategy(max_attempts=s3_max_attempts()),
        # An output stream opens no multipart upload before its first part is full: a small
        # object is one PUT (errors surface when the stream is closed, which every writer does).
        "allow_delayed_open": True,
    }
    if credentials is not None:
        options.update(access_key=credentials.access_key_id, secret_key=credentials.secret_access_key,
                       session_token=credentials.session_token)
    endpoint = s3_endpoint(credentials)
    region = s3_region(credentials)
    if endpoint:
        try:
            parts = urlsplit(endpoint if "://" in endpoint else f"https://{endpoint}")
        except ValueError as exc:
            variable = ("the connection's endpoint_url" if credentials is not None and credentials.endpoint_url
                        else "AWS_ENDPOINT_URL_S3" if os.environ.get("AWS_ENDPOINT_URL_S3") else "AWS_ENDPOINT_URL")
            raise ValueError(f"{variable} {display_uri(endpoint)!r} is not a URL ({exc}); "
                             "give the store's endpoint as http[s]://HOST[:PORT]") from None
        options.update(endpoint_override=parts.netloc, scheme=parts.scheme or "https")
    elif region is None:
        # AWS itself with no region configured: ask where the bucket lives (one anonymous
        # request), as the SDKs do; a bucket that cannot be located is reported by the
        # first real request, with its reason.
        try:
            region = pafs.resolve_s3_region(bucket)
        except OSError:
            region = None
    if region:
        options["region"] = region
    return pafs.S3FileSystem(**options)
