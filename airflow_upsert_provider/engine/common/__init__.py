"""Rules every layer follows, each written once: durations and timestamps, atomic file writes,
Spark Connect addresses and retry bounds.

May import: engine.errors."""
