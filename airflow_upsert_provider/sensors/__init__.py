"""Sensors of the upsert provider."""
