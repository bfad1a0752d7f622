"""The provider's metadata as Airflow reads it: valid against Airflow's own provider schemas
(the runtime one, and the stricter one of provider.yaml for the connection forms), every class
and module it names importable, the shard Asset scheme's normalizer, and the optional extras
as pyproject.toml declares them."""

from __future__ import annotations

import importlib
import json
import os
import random
import tomllib
from urllib.parse import SplitResult, urlsplit

import pytest

import airflow
from airflow_upsert_provider import get_provider_info
from airflow_upsert_provider.assets import ASSET_SCHEME, normalize_shard_uri
from tests.conftest import REPO_ROOT

jsonschema = pytest.importorskip("jsonschema")


def airflow_schema(name: str) -> dict:
    with open(os.path.join(os.path.dirname(airflow.__file__), name), encoding="utf-8") as handle:
        return json.load(handle)


def test_the_provider_info_is_valid_against_airflows_schemas():
    info = get_provider_info()
    jsonschema.Draft7Validator(airflow_schema("provider_info.schema.json")).validate(info)
    # provider.yaml's schema holds the connection form's rules (hidden fields, conn-fields).
    yaml_schema = airflow_schema("provider.yaml.schema.json")
    connection_types = {"$schema": yaml_schema["$schema"], **yaml_schema["properties"]["connection-types"]}
    jsonschema.Draft7Validator(connection_types).validate(info["connection-types"])
    upsert = next(c for c in info["connection-types"] if c["connection-type"] == "upsert")
    assert set(upsert["conn-fields"]) == {"consensus_url", "blob_root", "spark_conn_id", "default_buckets",
                                          "default_max_files_per_batch", "kafka_conn_id", "aws_conn_id"}
    assert upsert["ui-field-behaviour"]["relabeling"]["password"].startswith("Consensus password")


def test_every_class_and_module_the_provider_info_names_imports():
    info = get_provider_info()
    modules = [m for kind in ("hooks", "operators", "sensors", "triggers") for entry in info[kind]
               for m in entry["python-modules"]]
    names = [*info["notifications"], *info["extra-links"], *(p["plugin-class"] for p in info["plugins"]),
             *(c["hook-class-name"] for c in info["connection-types"]),
             *(a["handler"] for a in info["asset-uris"])]
    for module in modules:
        importlib.import_module(module)
    for name in names:
        module, _, attribute = name.rpartition(".")
        assert callable(getattr(importlib.import_module(module), attribute)), name
    integrations = {i["integration-name"] for i in info["integrations"]}
    assert all(entry["integration-name"] in integrations for kind in ("hooks", "operators", "sensors", "triggers")
               for entry in info[kind])


def test_the_optional_extras_are_the_ones_pyproject_declares_for_users():
    with open(os.path.join(REPO_ROOT, "pyproject.toml"), "rb") as handle:
        extras = tomllib.load(handle)["project"]["optional-dependencies"]
    # test and bench are the project's own, not a user's.
    assert set(get_provider_info()["optional-dependencies"]) == set(extras) - {"test", "bench"}
    assert all(get_provider_info()["optional-dependencies"].values())


def normalized(uri: str) -> str:
    """What Airflow's own sanitizing does before the handler, then the handler."""
    parts = urlsplit(uri)
    sanitized = SplitResult(parts.scheme.lower(), parts.netloc, parts.path.rstrip("/") or "/", parts.query, "")
    return normalize_shard_uri(sanitized).geturl()


def test_the_normalizer_keeps_every_shard_uri_and_refuses_what_names_no_shard():
    assert ASSET_SCHEME == "upsert"
    rng = random.Random(4)
    alphabet = "abcXYZ019_.-"
    for _ in range(400):
        conn = rng.choice("abcxyz") + "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 12)))
        shard = rng.choice("aZ09") + "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 20)))
        for written in (f"upsert://{conn}/{shard}", f"UPSERT://{conn}/{shard}/", f"upsert://{conn}/{shard}#x"):
            assert normalized(written) == f"upsert://{conn}/{shard}"
    bad = {
        "upsert:///orders": "is not a connection id",
        "upsert://upsert_default": "invalid shard id ''",
        "upsert://upsert_default/": "invalid shard id ''",
        "upsert://upsert_default/a b": "invalid shard id 'a b'",
        "upsert://upsert_default/a/b": "invalid shard id 'a/b'",
        "upsert://upsert_default/-x": "invalid shard id '-x'",
        "upsert://upsert_default/" + "x" * 129: "invalid shard id",
        "upsert://upsert_default/orders?v=1": "takes no query",
        "upsert://user@conn/orders": "is not a connection id",
    }
    for uri, reason in bad.items():
        with pytest.raises(ValueError) as refused:
            normalized(uri)
        message = str(refused.value)
        assert reason in message and message.startswith("shard asset 'upsert://"), (uri, message)


def test_airflow_applies_the_normalizer_to_a_shard_asset():
    """Through Airflow's providers manager, as a DAG file's Asset() is built."""
    from airflow.sdk import Asset

    assert Asset("upsert://upsert_default/orders/").uri == "upsert://upsert_default/orders"
    for uri in ("upsert://upsert_default/a b", "upsert://x/a/b"):
        with pytest.raises(ValueError, match="invalid shard id"):
            Asset(uri)
