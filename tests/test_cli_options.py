"""Option values of `upsertctl` parsed strictly: an integer is plain decimal digits, a Spark
Connect address's port is named as the address's (issue 34, bad input). No store, blob root or
Spark session is opened for a refused value."""

from __future__ import annotations

import json
import random

import pytest

from airflow_upsert_provider.cli.options import INT64_MAX, INT64_MIN, integer_option
from airflow_upsert_provider.engine.errors import ConfigurationError
from tests.helpers import run_cli as run

# What int() takes and a user does not mean as this number: underscores, blanks, a plus sign,
# digits of other scripts, other bases and exponents.
NOT_PLAIN_DIGITS = ["1_0", " 3 ", "3 ", " 3", "\t3", "3\n", "+3", "\u0663", "1\u0660", "0x10", "1e3", "", "-", "--1"]


@pytest.mark.parametrize("text", NOT_PLAIN_DIGITS)
def test_an_integer_option_takes_only_plain_decimal_digits(text):
    with pytest.raises(ConfigurationError) as raised:
        integer_option("--as-of", 0)(text)
    assert raised.value.message == f"--as-of takes an integer from 0 to 2**63-1, not {text!r}"
    assert raised.value.to_dict()["field"] == "as_of"


def test_every_decimal_integer_in_range_is_taken_as_written():
    # A seeded sweep over the bounds' neighbourhoods and random 64-bit values, with leading zeros.
    rng = random.Random(34)
    values = [INT64_MIN, INT64_MIN + 1, -1, 0, 1, INT64_MAX - 1, INT64_MAX]
    values += [rng.randint(INT64_MIN, INT64_MAX) for _ in range(2000)]
    parse = integer_option("--n")
    for value in values:
        assert parse(str(value)) == value
        digits = str(abs(value)).rjust(25, "0")
        assert parse(("-" if value < 0 else "") + digits) == value
    for value in (INT64_MIN - 1, INT64_MAX + 1, 10**30, -(10**30)):
        with pytest.raises(ConfigurationError, match="--n takes an integer from -2\\*\\*63 to 2\\*\\*63-1"):
            parse(str(value))


@pytest.mark.parametrize("text", ["1_0", " 3 "])
def test_upsertctl_refuses_an_integer_that_is_not_plain_digits_naming_the_option(text, tmp_path, monkeypatch,
                                                                                 capsys):
    monkeypatch.setenv("UPSERT_CONSENSUS_URL", f"sqlite:///{tmp_path / 'store' / 'c.db'}")
    monkeypatch.setenv("UPSERT_BLOB_ROOT", str(tmp_path / "blob"))
    code, out, err = run(capsys, "compact", "s", "--since", text, "--json")
    assert code == 2, err
    assert err == f"upsertctl: --since takes an integer from 0 to 2**63-1, not {text!r}\n"
    assert json.loads(out)["field"] == "since"
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no store, no blob root


@pytest.mark.parametrize("port", ["0", "65536", "99999"])
def test_a_remote_address_with_no_tcp_port_names_remote_not_port(port, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("UPSERT_CONSENSUS_URL", f"sqlite:///{tmp_path / 'store' / 'c.db'}")
    monkeypatch.setenv("UPSERT_BLOB_ROOT", str(tmp_path / "blob"))
    code, out, err = run(capsys, "status", "s", "--remote", f"sc://localhost:{port}/;token=SECRET", "--json")
    assert code == 2, err
    assert err == (f"upsertctl: the port of the Spark Connect address 'sc://localhost:{port}/' (--remote or "
                   f"UPSERT_SPARK_REMOTE) must be a TCP port (1-65535), not {int(port)}\n")
    assert json.loads(out)["field"] == "remote"
    assert "SECRET" not in out + err and "--port" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == []
