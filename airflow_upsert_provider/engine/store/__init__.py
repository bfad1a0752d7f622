"""The consensus store: its tables, compare-and-set, the commit and restore hooks it enforces
(GC claims, the stream fence) and the registry that composes them when a store is opened; also the
stream row and its pure rules, which the store's commit fence enforces.

May import: engine.errors, engine.config, spark, blob, sources."""
