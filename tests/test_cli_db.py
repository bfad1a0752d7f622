"""`upsertctl db status` changes nothing: a SQLite store that does not exist is reported as
such, not created (issue 34, bad input: sweep rows D1, D12)."""

from __future__ import annotations

import json

from tests.helpers import run_cli as run


def test_db_status_of_a_missing_sqlite_file_says_so_and_creates_nothing(tmp_path, capsys):
    path = tmp_path / "not" / "there" / "c.db"
    code, out, err = run(capsys, "db", "status", "--consensus", f"sqlite:///{path}", "--json")
    assert code == 2, err
    message = (f"no consensus store at {path}: the SQLite file does not exist (nothing was created; the first "
               "command that opens the store, e.g. upsertctl init, creates it)")
    assert err == f"upsertctl: {message}\n"
    assert json.loads(out) == {"error": "ConfigurationError", "message": message, "retryable": False,
                               "field": "consensus"}
    assert list(tmp_path.iterdir()) == []  # neither the file nor its directories


def test_db_status_of_an_existing_sqlite_store_reports_it(tmp_path, capsys):
    from airflow_upsert_provider.engine.store.registry import open_consensus

    path = tmp_path / "c.db"
    open_consensus(f"sqlite:///{path}").dispose()
    code, out, err = run(capsys, "db", "status", "--consensus", f"sqlite:///{path}", "--json")
    assert (code, err) == (0, "")
    status = json.loads(out)
    assert status["state"] == "current" and status["store_revision"] == status["code_revision"]
