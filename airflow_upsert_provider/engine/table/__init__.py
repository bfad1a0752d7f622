"""The keyed table as one shard: the shard object (consensus + blob + source), the run format
(write, merge-on-read) and binding planning.

May import: engine.errors, engine.config, spark, blob, sources, store."""
