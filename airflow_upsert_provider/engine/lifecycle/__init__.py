"""Recovery procedures (seek, restore, Kafka group recovery), source acknowledgements and Kafka
group offsets.

May import: engine.errors, engine.config, spark, blob, sources, store, table, maintenance."""
