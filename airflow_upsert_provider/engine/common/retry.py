"""Retry bounds and backoff, in one place: every retry loop of the package takes its policy
from here (the writer, compaction, checkpoints, streams, observations and page delivery)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RetryPolicy:
    """How an operation is retried: ``max_attempts`` in all, waiting ``base_seconds *
    multiplier**n`` (at most ``max_wait_seconds``) between attempts."""

    max_attempts: int = 6
    base_seconds: float = 1.0
    max_wait_seconds: float = 30.0
    multiplier: float = 2.0

    def __post_init__(self) -> None:
        if not isinstance(self.max_attempts, int) or self.max_attempts < 1:
            raise ValueError(f"max_attempts must be an integer >= 1, got {self.max_attempts!r}")
        for name in ("base_seconds", "max_wait_seconds", "multiplier"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"{name} must be a number >= 0, got {value!r}")

    @property
    def retries(self) -> int:
        """Attempts after the first."""
        return self.max_attempts - 1


# An append whose outcome is unknown (the store went away mid-commit) is retried with the same
# token: exponential backoff from half a second, each wait at most 5 s.
OUTCOME_UNKNOWN_APPEND = RetryPolicy(max_attempts=4, base_seconds=0.5, max_wait_seconds=5.0)

# A batch whose commit was refused because GC claimed its staged files is staged again at once
# (the writer paused past GC's grace period, again and again).
RESTAGE = RetryPolicy(max_attempts=4, base_seconds=0.0, max_wait_seconds=0.0)

# A compare-and-set lost to a concurrent writer is decided again from a fresh read at once: a
# few rounds settle any real contention (compaction, checkpoints, stream transitions,
# observation alert state).
CAS_CONTENTION = RetryPolicy(max_attempts=5, base_seconds=0.0, max_wait_seconds=0.0)

# A page to PagerDuty or Slack: 429, 5xx and connection failures, exponential backoff from 1 s,
# each wait at most 30 s (a 429's Retry-After is honoured up to that cap).
PAGE_DELIVERY = RetryPolicy(max_attempts=6, base_seconds=1.0, max_wait_seconds=30.0)

# The Spark Connect client's retries of a server that stopped answering: its own policy retries
# for at least ten minutes; a task should fail within about a minute instead (retryable:
# Airflow's retries and backoff take over). 50 ms x 4^n, each wait at most 30 s: six retries,
# about 47 s.
SPARK_CONNECT_CLIENT = RetryPolicy(max_attempts=7, base_seconds=0.05, max_wait_seconds=30.0, multiplier=4.0)
