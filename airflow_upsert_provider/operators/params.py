"""Trigger-form params of the example DAGs, in one way for all of them.

Airflow 3.3's trigger form renders a number field with the schema's ``minimum``/``maximum`` as
the bounds of its input, which clamps a value typed outside them on blur (``-64`` becomes
``1``) and submits that: a run starts with a number nobody typed. So the bounds go in an
``allOf`` sub-schema, which the form does not read and Airflow's validation on trigger does:
an out-of-range value is refused with a message naming the param and the bound, and the
operators refuse it again (:mod:`operators.arguments`).

A param whose blank means "none" is nullable (``type: ["null", "string"]``, default None):
the form renders it optional, so the Trigger button is enabled with its documented default.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import Param

# The served documentation (plugins/docs.py), relative to the UI's <base href>: a doc_md link
# to a docs page resolves to the api-server's docs route whatever the root path.
DOCS_HREF = "upsert-provider/docs/"


def number_param(default: float, *, type: str = "number", minimum: float | None = None,
                 maximum: float | None = None, **kwargs: Any) -> Param:
    """A numeric param refused out of [minimum, maximum] on trigger, never clamped by the form."""
    bounds = {name: value for name, value in (("minimum", minimum), ("maximum", maximum)) if value is not None}
    if bounds:
        kwargs["allOf"] = [bounds]
    return Param(default, type=type, **kwargs)


def optional_text_param(*, pattern: str | None = None, **kwargs: Any) -> Param:
    """A text param whose blank means none: nullable, default None (optional in the form)."""
    if pattern is not None:
        kwargs["pattern"] = pattern
    return Param(None, type=["null", "string"], **kwargs)

