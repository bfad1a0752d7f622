"""How results and failures are printed for humans: escaped, one line where promised."""

from __future__ import annotations

import json
from typing import Any

from airflow_upsert_provider.engine.common.time_text import format_timestamp


def printable(text: str) -> str:
    """``text`` with control and other unprintable characters escaped as Python writes them
    (``\\n``, ``\\x1b``): a file name, a reason or an actor given by someone else cannot
    forge a line of output or move the terminal's cursor."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


def print_human(result: dict[str, Any]) -> None:
    for key, value in result.items():
        if isinstance(value, dict):
            print(f"{key}:")
            for k, v in value.items():
                print(f"  {k}: {json.dumps(v, default=str) if isinstance(v, (dict, list)) else v}")
        else:
            print(f"{key}: {value}")


def iso(at: float | None) -> str:
    return format_timestamp(at)
