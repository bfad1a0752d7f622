"""The OpenLineage objects of a :class:`~airflow_upsert_provider.lineage.Lineage`: datasets with
the spec's schema and output-statistics facets, and this provider's two custom facets.

Imported only when the OpenLineage provider reports a task (it brings ``openlineage-python``).
The custom facets follow the spec's rules for them: a name with this provider's prefix
(``upsert_``), ``_producer`` naming this provider's release, ``_schemaURL`` naming the facet's
definition in :data:`FACET_SCHEMA` (docs/lineage.md shows it).
"""

from __future__ import annotations

from typing import Any

from attrs import define
from openlineage.client.event_v2 import InputDataset, OutputDataset
from openlineage.client.facet_v2 import JobFacet, OutputDatasetFacet, output_statistics_output_dataset, schema_dataset

from airflow_upsert_provider import DISTRIBUTION_NAME, __version__
from airflow_upsert_provider.lineage.rules import DatasetSpec, Lineage

# Who produced the facets: this provider's release on the package index.
PRODUCER = f"https://pypi.org/project/{DISTRIBUTION_NAME}/{__version__}/"
SCHEMA_URL = f"{PRODUCER}lineage-facets.json"
FRONTIER_FACET = "upsert_frontier"
BATCHES_FACET = "upsert_batches"

SPEC_DEFS = "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/"


def _definition(base: str, properties: dict[str, tuple[Any, str]], required: list[str]) -> dict[str, Any]:
    """A custom facet's JSON schema: the spec's ``base`` facet and ``properties`` (name: (JSON
    type, description))."""
    return {"allOf": [{"$ref": f"{SPEC_DEFS}{base}"}, {
        "type": "object",
        "properties": {name: {"type": kind, "description": text} for name, (kind, text) in properties.items()},
        "required": required,
    }]}


# The JSON schema of the custom facets (draft 2020-12, as the spec's own), one $defs entry each.
FACET_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$defs": {
        "UpsertFrontierJobFacet": _definition("JobFacet", {
            "shard": ("string", "the shard id"),
            "upper": ("integer", "the first ts not yet written, after the task"),
            "since": ("integer", "reads below this ts are compacted away"),
            "status": (["string", "null"], "the shard's stream: READY, STOPPING, STOPPED or RECOVERING"),
        }, ["shard", "upper", "since", "status"]),
        "UpsertBatchesOutputDatasetFacet": _definition("OutputDatasetFacet", {
            "from_ts": ("integer", "the first batch this task committed"),
            "to_ts": ("integer", "one past the last batch it committed"),
            "rows_out": ("integer", "rows its batches wrote"),
            "schema_version": (["integer", "null"],
                               "the table schema version at to_ts; null until the shard has schema versions"),
        # A null schema_version is left out of the event, as every null is.
        }, ["from_ts", "to_ts", "rows_out"]),
    },
}


class _DefinedInFacetSchema:
    """A custom facet whose ``_schemaURL`` is its definition in :data:`FACET_SCHEMA`."""

    @classmethod
    # no public API: the OpenLineage client takes a facet's _schemaURL from this method only.
    def _get_schema(cls) -> str:
        return f"{SCHEMA_URL}#/$defs/{cls.__name__}"


@define
class UpsertFrontierJobFacet(_DefinedInFacetSchema, JobFacet):
    """The shard's frontier after the task."""

    shard: str
    upper: int
    since: int
    status: str | None


@define
class UpsertBatchesOutputDatasetFacet(_DefinedInFacetSchema, OutputDatasetFacet):
    """The batches an upsert committed: ``to_ts`` exclusive, as the commit event's keys."""

    from_ts: int
    to_ts: int
    rows_out: int
    schema_version: int | None


def _dataset_facets(spec: DatasetSpec) -> dict[str, Any]:
    if not spec.fields:
        return {}
    return {"schema": schema_dataset.SchemaDatasetFacet(
        fields=[schema_dataset.SchemaDatasetFacetFields(name=name, type=kind) for name, kind in spec.fields])}


def _output(spec: DatasetSpec) -> OutputDataset:
    facets: dict[str, Any] = {}
    if (spec.rows, spec.bytes, spec.files) != (None, None, None):
        facets["outputStatistics"] = output_statistics_output_dataset.OutputStatisticsOutputDatasetFacet(
            rowCount=spec.rows, size=spec.bytes, fileCount=spec.files)
    if spec.batches is not None:
        facets[BATCHES_FACET] = UpsertBatchesOutputDatasetFacet(producer=PRODUCER, **spec.batches)
    return OutputDataset(namespace=spec.namespace, name=spec.name, facets=_dataset_facets(spec),
                         outputFacets=facets)


def to_operator_lineage(lineage: Lineage) -> Any:
    """The provider's ``OperatorLineage`` of ``lineage``."""
    from airflow.providers.openlineage.extractors import OperatorLineage

    return OperatorLineage(
        inputs=[InputDataset(namespace=s.namespace, name=s.name, facets=_dataset_facets(s)) for s in lineage.inputs],
        outputs=[_output(s) for s in lineage.outputs],
        job_facets={FRONTIER_FACET: UpsertFrontierJobFacet(producer=PRODUCER, **lineage.frontier)},
    )
