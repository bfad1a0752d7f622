"""The outbox rules as pure functions (issue 34 item 2): a lease longer than one bounded
delivery, pages of a dedup key taken strictly in order, newer events superseding undelivered
older ones, delivery recorded per channel, a bounded outbox that counts what it drops."""

from __future__ import annotations

import itertools
import random

from airflow_upsert_provider.engine.common.retry import PAGE_DELIVERY, RetryPolicy
from airflow_upsert_provider.engine.frontier.alerts import (
    MAX_OUTBOX,
    OUTBOX_LEASE_SECONDS,
    PAGE_CHANNELS,
    PAGE_REQUEST_TIMEOUT_SECONDS,
    AlertState,
    check_delivery_policy,
    enqueue_page,
    max_delivery_seconds,
    settle_pages,
    take_pages,
)

NOW = 1_800_000_000.0


def event(action: str, key: str = "k") -> dict:
    return {"action": action, "dedup_key": key, "summary": f"{action} {key}"}


def actions(state: AlertState) -> list[tuple[str, str]]:
    return [(entry["event"]["dedup_key"], entry["event"]["action"]) for entry in state.outbox]


def test_the_lease_outlasts_the_longest_delivery() -> None:
    # Six attempts per channel, each cut after the request timeout, waits capped at 30 s (a
    # Retry-After too), two channels: 2 x (6 x 10 + 5 x 30) = 420 s.
    assert max_delivery_seconds() == PAGE_CHANNELS * (PAGE_DELIVERY.max_attempts * PAGE_REQUEST_TIMEOUT_SECONDS
                                                      + (PAGE_DELIVERY.max_attempts - 1) * PAGE_DELIVERY.max_wait_seconds)
    assert OUTBOX_LEASE_SECONDS > max_delivery_seconds() == 420.0
    for attempts, wait, timeout, channels in itertools.product((1, 3, 6), (0.5, 30.0), (1.0, 10.0), (1, 2)):
        policy = RetryPolicy(max_attempts=attempts, base_seconds=0.1, max_wait_seconds=wait)
        assert max_delivery_seconds(policy, channels=channels, request_timeout=timeout) >= \
            channels * attempts * timeout


def test_a_delivery_policy_is_taken_iff_its_longest_delivery_fits_the_lease() -> None:
    """Issue 35 item 4: the delivery policy is a parameter; one that could outlast the lease (a
    live delivery overtaken by a second round) is refused, naming the parameter."""
    import pytest

    from airflow_upsert_provider.engine.errors import ConfigurationError

    accepted = 0
    for attempts, base, wait, multiplier in itertools.product((1, 2, 6, 7, 20), (0.0, 0.01, 1.0),
                                                              (0.0, 0.05, 30.0, 31.0, 300.0), (1.0, 2.0, 4.0)):
        policy = RetryPolicy(max_attempts=attempts, base_seconds=base, max_wait_seconds=wait, multiplier=multiplier)
        fits = max_delivery_seconds(policy) <= max_delivery_seconds()
        assert OUTBOX_LEASE_SECONDS > max_delivery_seconds(policy) or not fits
        if fits:
            assert check_delivery_policy(policy) is policy
            accepted += 1
        else:
            with pytest.raises(ConfigurationError, match="outbox lease") as refused:
                check_delivery_policy(policy)
            assert refused.value.details["field"] == "delivery_policy"
    assert 0 < accepted < 5 * 3 * 5 * 3
    assert check_delivery_policy(PAGE_DELIVERY) is PAGE_DELIVERY
    with pytest.raises(ConfigurationError, match="must be a RetryPolicy, got dict"):
        check_delivery_policy({"max_attempts": 2})


def test_a_resolve_never_overtakes_its_trigger() -> None:
    # A round took the trigger and died (leased); the next round decides the resolve: it waits.
    state, _ = enqueue_page(AlertState("s"), event("trigger"), "t")
    state, taken = take_pages(state, NOW)
    assert [e["id"] for e in taken] == ["t"]
    state, _ = enqueue_page(state, event("resolve"), "r", NOW + 1)
    assert take_pages(state, NOW + 1) == (state, ())
    # The lease ran out: the trigger goes first (it may have reached a channel), then the resolve.
    state, taken = take_pages(state, NOW + OUTBOX_LEASE_SECONDS)
    assert [e["id"] for e in taken] == ["t"]
    state = settle_pages(state, delivered=["t"], sent_at=NOW + OUTBOX_LEASE_SECONDS)
    state, taken = take_pages(state, NOW + OUTBOX_LEASE_SECONDS + 1)
    assert [e["id"] for e in taken] == ["r"]


def test_newer_events_supersede_undelivered_older_ones() -> None:
    # A trigger no round ever took, then the resolve: nobody was paged, nothing is sent.
    state, _ = enqueue_page(AlertState("s"), event("trigger"), "t1")
    state, _ = enqueue_page(state, event("resolve"), "r1")
    assert state.outbox == ()
    # A trigger a round took and released (maybe delivered): only the resolve goes.
    state, _ = enqueue_page(AlertState("s"), event("trigger"), "t1")
    state, _ = take_pages(state, NOW)
    state = settle_pages(state, released=["t1"])
    state, _ = enqueue_page(state, event("resolve"), "r1", NOW)
    assert [e["id"] for e in state.outbox] == ["r1"]
    # A trigger that reached PagerDuty is never superseded: Slack gets it, then the resolve.
    state, _ = enqueue_page(AlertState("s"), event("trigger"), "t1")
    state, _ = take_pages(state, NOW)
    state = settle_pages(state, released=["t1"], reached={"t1": ["pagerduty"]})
    state, _ = enqueue_page(state, event("resolve"), "r1", NOW)
    assert [(e["id"], e["delivered"]) for e in state.outbox] == [("t1", ["pagerduty"]), ("r1", [])]
    # Other keys are left alone.
    state, _ = enqueue_page(AlertState("s"), event("trigger", "a"), "a1")
    state, _ = enqueue_page(state, event("trigger", "b"), "b1")
    state, _ = enqueue_page(state, event("resolve", "a"), "a2")
    assert actions(state) == [("b", "trigger")]


def test_a_channel_that_got_a_page_is_remembered_across_releases() -> None:
    state, _ = enqueue_page(AlertState("s"), event("trigger"), "t")
    state, _ = take_pages(state, NOW)
    state = settle_pages(state, released=["t"], reached={"t": ["pagerduty"]})
    state, taken = take_pages(state, NOW + 1)
    assert taken[0]["delivered"] == ["pagerduty"]
    state = settle_pages(state, released=["t"], reached={"t": ["pagerduty"]})
    assert state.outbox[0]["delivered"] == ["pagerduty"]
    assert AlertState.from_dict(state.to_dict()) == state


def test_receivers_see_what_the_decisions_say_under_any_interleaving() -> None:
    """Seeded sweeps: decisions alternate trigger/resolve per key; rounds take, deliver (or die,
    or fail on one channel) and settle in random order. Whatever happens, what each channel
    received for a key is in decision order, never a trigger after a later resolve, and once
    the outbox drains each channel's last page is the newest decision (or nothing was sent and
    the newest decision is a resolve)."""
    channels = ("pagerduty", "slack")
    for seed in range(300):
        rng = random.Random(seed)
        state = AlertState("s")
        now = NOW
        decided: dict[str, list[str]] = {"a": [], "b": []}
        received: dict[tuple[str, str], list[str]] = {(k, c): [] for k in decided for c in channels}
        leased: list[dict] = []
        for step in range(rng.randrange(5, 25)):
            now += rng.choice((1.0, 30.0, OUTBOX_LEASE_SECONDS))
            move = rng.random()
            if move < 0.4:
                key = rng.choice("ab")
                action = "resolve" if decided[key] and decided[key][-1] == "trigger" else "trigger"
                decided[key].append(action)
                state, _ = enqueue_page(state, {**event(action, key), "n": len(decided[key])}, f"{key}{step}", now)
            elif move < 0.7:
                state, taken = take_pages(state, now)
                leased += taken
            elif leased:
                entry = leased.pop(rng.randrange(len(leased)))
                if now >= entry["leased_until"] or rng.random() < 0.2:
                    continue  # the round died before sending (a delivery never outlasts its lease)
                reached = [c for c in channels if c not in entry["delivered"] and rng.random() < 0.8]
                for c in reached:
                    received[(entry["event"]["dedup_key"], c)].append((entry["event"]["n"], entry["event"]["action"]))
                if rng.random() < 0.2:
                    continue  # the round died after sending, before recording it
                if len(reached) + len(entry["delivered"]) == len(channels):
                    state = settle_pages(state, delivered=[entry["id"]], sent_at=now)
                else:
                    state = settle_pages(state, released=[entry["id"]], reached={entry["id"]: reached})
        # Drain: live rounds deliver everything.
        for _ in range(60):
            now += OUTBOX_LEASE_SECONDS
            state, taken = take_pages(state, now)
            for entry in taken:
                for c in channels:
                    if c not in entry["delivered"]:
                        received[(entry["event"]["dedup_key"], c)].append((entry["event"]["n"], entry["event"]["action"]))
                state = settle_pages(state, delivered=[entry["id"]], sent_at=now)
        assert state.outbox == (), seed
        for (key, channel), got in received.items():
            numbers = [n for n, _ in got]
            # In decision order (a page a dead round sent may come again, right after itself).
            assert numbers == sorted(numbers), (seed, key, channel, got)
            if decided[key]:
                newest = (len(decided[key]), decided[key][-1])
                assert (got and got[-1] == newest) or (newest[1] == "resolve" and (not got or got[-1][1] == "resolve")),\
                    (seed, key, channel, got, decided[key])
