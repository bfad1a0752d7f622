"""Spark Connect addresses, ``sc://HOST:PORT[/;name=value;...]``, read and written in one place.

A parameter such as ``token=`` is a secret: what messages and logs show is
:func:`display_remote`, without the parameters."""

from __future__ import annotations

from airflow_upsert_provider.engine.errors import ConfigurationError

SCHEME = "sc://"
# Spark's own client's default port.
DEFAULT_PORT = 15002
# The parameter that names the server session a client joins.
SESSION_ID_PARAM = "session_id"


def check_port(port: int) -> int:
    if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
        raise ConfigurationError(f"--port must be a TCP port (1-65535), not {port!r}", field="port")
    return port


def _split(remote: str) -> tuple[str, list[str]]:
    """(``HOST:PORT`` part, parameters) of an ``sc://`` address."""
    head, slash, params = remote[len(SCHEME):].partition("/")
    return head, [p for p in params.split(";") if p] if slash else []


def parse_remote(url: str) -> tuple[str, int]:
    """(host, port) of a Spark Connect address ``sc://HOST:PORT[/;params]`` (port default
    15002, as Spark's own client does); a malformed one is a ConfigurationError."""
    if not isinstance(url, str) or not url.startswith(SCHEME):
        raise ConfigurationError("a Spark Connect address looks like sc://HOST:PORT, not "
                                 f"{str(url).split(';', 1)[0]!r}", field="remote")
    host, port_text = parse_endpoint(_split(url)[0].split(";", 1)[0], default_port=DEFAULT_PORT)
    if not host or not port_text.isdigit():
        raise ConfigurationError(f"a Spark Connect address looks like sc://HOST:PORT, not {url.split(';', 1)[0]!r}",
                                 field="remote")
    port = int(port_text)
    if not 1 <= port <= 65535:
        # Not check_port's message: that names spark-server start's --port, not this address.
        raise ConfigurationError(f"the port of the Spark Connect address {url.split(';', 1)[0]!r} (--remote or "
                                 f"UPSERT_SPARK_REMOTE) must be a TCP port (1-65535), not {port}", field="remote")
    return host, port


def parse_endpoint(endpoint: str, *, default_port: int | None = None) -> tuple[str, str]:
    """(host without brackets, port text) of ``HOST:PORT`` (``[v6]:PORT``); the port text is
    empty, or ``default_port``, when there is none."""
    host, sep, port_text = endpoint.rpartition(":")
    if not sep:
        host, port_text = endpoint, "" if default_port is None else str(default_port)
    return host.strip("[]"), port_text


def format_remote(host: str, port: int) -> str:
    """``sc://HOST:PORT``, an IPv6 host in brackets."""
    return f"{SCHEME}[{host}]:{port}" if ":" in host else f"{SCHEME}{host}:{port}"


def display_remote(url: str) -> str:
    """``sc://HOST:PORT`` of a Connect address, without its parameters (``token=`` is a
    secret): what messages and logs show."""
    try:
        host, port = parse_remote(url)
    except ConfigurationError:
        return "sc://?"
    return format_remote(host, port)


def named_session_id(remote: str) -> str | None:
    """The ``session_id`` parameter of a Connect address, if it names one."""
    for param in _split(remote)[1]:
        name, _, value = param.partition("=")
        if name == SESSION_ID_PARAM and value:
            return value
    return None


def with_session_id(remote: str, session_id: str) -> str:
    """``remote`` with its server session named ``session_id`` (its other parameters kept)."""
    head, params = _split(remote)
    kept = [p for p in params if not p.startswith(f"{SESSION_ID_PARAM}=")]
    return f"{SCHEME}{head}/;" + ";".join([*kept, f"{SESSION_ID_PARAM}={session_id}"])
