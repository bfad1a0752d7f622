"""The upsert engine: pure Python + PySpark. It never imports Airflow.

Layers, lowest first; a layer imports only the layers below it (tests/test_imports.py):
errors; common (durations and timestamps, atomic writes, Connect addresses, retry policy);
spark, blob; sources; config; store (consensus, stream row, registry); table (shard, runs,
bindings); maintenance; lifecycle (recovery, acks, group offsets); frontier; write (records,
staging, batch job, writer).
"""
