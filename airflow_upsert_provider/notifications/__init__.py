"""Delivery of frontier pages (PagerDuty Events API v2, Slack incoming webhooks)."""
