"""The expected table, computed in plain Python straight from the source files."""

from __future__ import annotations

import glob
import json
import os
from typing import Any


def oracle_table(
    root: str,
    keys: tuple[str, ...] = ("id",),
    order_by: str | None = "updated_at",
    delete_marker: str | None = "deleted",
    max_offset: dict[str, int] | None = None,
) -> dict[tuple, dict[str, Any]]:
    """Latest record per key by (order column, partition, offset, line); tombstones dropped.

    ``max_offset`` limits each partition to segments with offset < the given value.
    """
    best: dict[tuple, tuple[tuple, dict[str, Any]]] = {}
    for path in glob.glob(os.path.join(root, "*", "*.jsonl")):
        partition = os.path.basename(os.path.dirname(path))
        name = os.path.basename(path)
        if name.startswith((".", "_")):
            continue
        offset = int(name.split(".")[0])
        if max_offset is not None and offset >= max_offset.get(partition, 0):
            continue
        with open(path, encoding="utf-8") as handle:
            for line_no, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                record = json.loads(line)
                key = tuple(record[k] for k in keys)
                rank = ((record.get(order_by),) if order_by else ()) + (partition, offset, line_no)
                if key not in best or _rank_key(rank) > _rank_key(best[key][0]):
                    best[key] = (rank, record)
    table = {}
    for key, (_, record) in best.items():
        if delete_marker and record.get(delete_marker):
            continue
        table[key] = {k: v for k, v in record.items() if k != delete_marker}
    return table


def _rank_key(rank: tuple) -> tuple:
    # Spark orders NULL below every value; mirror that.
    return tuple((0, 0) if v is None else (1, v) for v in rank)


def table_from_rows(rows, keys: tuple[str, ...] = ("id",)) -> dict[tuple, dict[str, Any]]:
    out = {}
    for row in rows:
        data = row.asDict() if hasattr(row, "asDict") else dict(row)
        out[tuple(data[k] for k in keys)] = data
    return out
