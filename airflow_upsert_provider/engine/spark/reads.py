"""Spark settings of the engine's reads, shared by the sessions it builds (session.py) and the
Spark Connect servers it starts (server.py)."""

from __future__ import annotations

# Spark's Parquet reader (parquet-mr) verifies each page's CRC only when told: a bit flipped in
# a page that still decodes would otherwise be read as data wherever no Hadoop checksum file
# (.crc) sits beside the run file. Every run writer puts a CRC on each page.
PAGE_CHECKSUM_CONF = {"spark.hadoop.parquet.page.verify-checksum.enabled": "true"}
