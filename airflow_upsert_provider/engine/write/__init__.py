"""The write path on top of every other layer: record reading and validation, batch staging, the
Spark batch job, the writer and continuous runs.

May import: every other engine layer."""
