"""Triggers of the upsert provider (deferrable sensors)."""
