"""The frontier: stall rules and alert state (pure), observations and their outbox, upstream lag.

May import: engine.errors, engine.config, spark, blob, sources, store, table, maintenance, lifecycle."""
