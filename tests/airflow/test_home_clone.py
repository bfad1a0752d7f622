"""A cloned Airflow home starts from the run's migrated database, not from the session home a
worker's earlier tests filled: a test that counts the Asset events of its own runs in a clone
must not see another test's (test_overlap.py counts them per deployment)."""

from __future__ import annotations

import sqlite3


def _asset_uris(path: str) -> set[str]:
    with sqlite3.connect(path) as db:
        return {uri for (uri,) in db.execute("SELECT uri FROM asset")}


def test_a_clone_holds_none_of_the_session_homes_runs(airflow_home, tmp_path):
    uri = "upsert://upsert_default/left-by-an-earlier-test"
    session_db = f"{airflow_home.path}/airflow.db"
    with sqlite3.connect(session_db) as db:
        db.execute("INSERT INTO asset (name, uri, \"group\", extra, created_at, updated_at) "
                   "VALUES (?, ?, 'asset', '{}', CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)", (uri, uri))
    # Into the database file itself, as an Airflow process that ended leaves it (a copy of
    # the file alone would miss a row still in the write-ahead log).
    with sqlite3.connect(session_db) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    try:
        assert uri in _asset_uris(session_db)
        clone = airflow_home.clone(str(tmp_path / "clone"))
        assert uri not in _asset_uris(f"{clone.path}/airflow.db")
        # A clone of a clone starts from the same template.
        assert uri not in _asset_uris(f"{clone.clone(str(tmp_path / 'again')).path}/airflow.db")
    finally:
        with sqlite3.connect(session_db) as db:
            db.execute("DELETE FROM asset WHERE uri = ?", (uri,))
