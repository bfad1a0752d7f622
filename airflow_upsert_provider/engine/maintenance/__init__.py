"""Compaction, checkpoints, garbage collection and source retention (planning pure, effects in
shells).

May import: engine.errors, engine.config, spark, blob, sources, store, table."""
