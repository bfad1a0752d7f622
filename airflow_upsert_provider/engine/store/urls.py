"""Consensus URLs: parsing, the default drivers, the options each backend takes, and masking
the password wherever a URL or a driver's error is shown."""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine.url import URL, make_url

from airflow_upsert_provider.engine.errors import ConfigurationError


# Drivers a bare ``postgresql://`` or ``postgres://`` (the libpq spelling) URL means.
_DEFAULT_DRIVERS = {"postgres": "postgresql+psycopg", "postgresql": "postgresql+psycopg"}


def normalize_url(url: str) -> str:
    """Accept ``postgresql://`` and ``postgres://`` as the psycopg 3 driver. Raises
    :class:`ConfigurationError` (without echoing the URL) when it cannot be parsed."""
    parsed = parse_url(url)
    driver = _DEFAULT_DRIVERS.get(parsed.drivername)
    if driver is not None:
        parsed = parsed.set(drivername=driver)
    return parsed.render_as_string(hide_password=False)


def redact_url(url: str) -> str:
    """The URL with its password masked, for logs and error messages."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # an unparseable URL still must not leak what it holds
        return "<unparseable consensus url>"


def _short(exc: BaseException, url: str | None = None) -> str:
    """The first line of a driver error, with the password of ``url`` masked should the
    driver have echoed it."""
    text = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    line = text[0] if text else type(exc).__name__
    password = _password_of(url) if url else None
    return line.replace(password, "***") if password else line


def _password_of(url: str) -> str | None:
    try:
        return make_url(url).password or None
    except Exception:
        return None


def parse_url(url: str) -> URL:
    """A consensus URL, parsed; a clear error (that does not echo the URL, which may hold a
    password) when it cannot be."""
    try:
        return make_url(url)
    except Exception:
        raise ConfigurationError(
            "invalid consensus URL (expected sqlite:///PATH or postgresql://USER@HOST/DB)",
            field="consensus",
        ) from None


def with_password(url: str, password: str | None) -> str:
    """``url`` with ``password`` set, for stores that keep the password apart from the URL."""
    if not password:
        return url
    return make_url(normalize_url(url)).set(password=password).render_as_string(hide_password=False)


# Query options of a sqlite:/// URL that the SQLite driver uses (it ignores any other).
SQLITE_URL_OPTIONS = frozenset({"timeout", "check_same_thread", "cached_statements", "detect_types"})
# How long a SQLite transaction waits for the write lock when the URL gives no ``timeout``.
SQLITE_DEFAULT_TIMEOUT_S = 60.0

# Session timeouts of a PostgreSQL consensus, in milliseconds: options of its URL that the
# engine applies to every session it opens (libpq never sees them). A session waiting for a
# lock, or a statement running, longer fails retryably instead of holding writers up.
POSTGRES_TIMEOUT_DEFAULTS = {"lock_timeout": 10_000, "statement_timeout": 60_000}
_DURATION_UNITS = {"ms": 1, "s": 1000, "min": 60_000}


def parse_timeout_ms(option: str, value: Any) -> int:
    """A consensus URL's timeout option as milliseconds: ``500ms``, ``10s``, ``2min`` or a bare
    number of milliseconds (PostgreSQL's spelling); 0 turns the timeout off."""
    text = value.strip().lower() if isinstance(value, str) else ""
    number, unit = text, "ms"
    for suffix in sorted(_DURATION_UNITS, key=len, reverse=True):
        if text.endswith(suffix):
            number, unit = text[: -len(suffix)].strip(), suffix
            break
    if not number.isdigit() or int(number) * _DURATION_UNITS[unit] > 2**31 - 1:
        shown = value if isinstance(value, str) else ", ".join(map(str, value))
        raise ConfigurationError(
            f"consensus URL option {option} takes one duration (e.g. 10s, 500ms, 1min; a bare number is "
            f"milliseconds; 0 turns it off), not {shown!r}",
            field=option,
        )
    return int(number) * _DURATION_UNITS[unit]


def postgres_session_options(query: Any) -> str:
    """The libpq ``options`` (``-c name=ms ...``) that set the session timeouts the URL's
    ``query`` asks for (else the defaults), followed by any ``options`` of the URL itself."""
    timeouts = {
        name: parse_timeout_ms(name, query[name]) if name in query else default
        for name, default in POSTGRES_TIMEOUT_DEFAULTS.items()
    }
    options = " ".join(f"-c {name}={ms}" for name, ms in timeouts.items())
    own = query.get("options")
    if own:
        options += " " + (own if isinstance(own, str) else " ".join(own))
    return options


def sqlite_busy_timeout_ms(query: Any) -> int:
    """How long SQLite waits for its write lock: the URL's ``timeout`` (seconds), else 60 s."""
    if "timeout" not in query:
        return int(SQLITE_DEFAULT_TIMEOUT_S * 1000)
    value = query["timeout"]
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = float("nan")
    if not (0 <= seconds < 2**31 / 1000):
        raise ConfigurationError(
            f"consensus URL option timeout takes one number of seconds >= 0, not {value!r}", field="timeout"
        )
    return int(seconds * 1000)
