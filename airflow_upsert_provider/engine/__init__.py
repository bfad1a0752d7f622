"""The upsert engine: pure Python + PySpark. It never imports Airflow.

Layers: consensus (the linearizable store), blob (files), sources (offset-addressed input),
shard (state, bindings, compare_and_append, read), upsert (one Spark batch), writer (the
run loop that classifies every batch it holds).
"""
