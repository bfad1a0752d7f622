"""The stream lifecycle rules of engine/store/stream_rules.py, as pure functions (invariants 12, 14, 16).

Every transition is tried from every status; the store-level races live in test_brooklin.py."""

from __future__ import annotations

from dataclasses import replace

import pytest

from airflow_upsert_provider.engine.store.stream_rules import (
    Status,
    StreamState,
    decide_begin_recovery,
    decide_finalize,
    decide_restore,
    decide_resume,
    decide_resume_after_recovery,
    decide_seek,
    decide_stop,
    fence,
    initial_state,
    next_epoch,
    refuse_start,
)

NOW = 1_800_000_000.0  # seconds; an epoch begun now is 1_800_000_000_000 (ms)
EPOCH = 1_700_000_000_000
ACTOR = "ops@example"
POSITION = {"p0": 40, "p1": 30}


def state(status: Status, *, version: int = 3, epoch: int = EPOCH, seeked_epoch: int | None = None) -> StreamState:
    return StreamState("orders", status, version, epoch, seeked_epoch=seeked_epoch,
                       seek_position=POSITION if seeked_epoch is not None else None,
                       changed_by="earlier", changed_at=NOW - 60, reason="before")


# The five states a stream can be found in: a recovery is "open" before its seek and after it.
STATES = {
    "READY": state(Status.READY),
    "STOPPING": state(Status.STOPPING),
    "STOPPED": state(Status.STOPPED),
    "RECOVERING": state(Status.RECOVERING),
    "RECOVERING_SEEKED": state(Status.RECOVERING, seeked_epoch=EPOCH),
}

TRANSITIONS = {
    "stop": lambda s: decide_stop(s, ACTOR, NOW, "maintenance"),
    # A finalizer acting on exactly the version it read.
    "finalize": lambda s: decide_finalize(s, s, ACTOR, NOW),
    "resume": lambda s: decide_resume(s, ACTOR, NOW, "done"),
    "recover begin": lambda s: decide_begin_recovery(s, ACTOR, NOW, "lost store"),
    "recover seek": lambda s: decide_seek(s, None, POSITION, ACTOR, NOW),
    "recover resume": lambda s: decide_resume_after_recovery(s, None, ACTOR, NOW),
}

CHANGE, SAME, REFUSED = "change", "same", "refused"

# (transition, from state) -> (what happens, status afterwards, phrase of the refusal)
TABLE = {
    ("stop", "READY"): (CHANGE, Status.STOPPING, None),
    ("stop", "STOPPING"): (SAME, Status.STOPPING, None),
    ("stop", "STOPPED"): (SAME, Status.STOPPED, None),
    ("stop", "RECOVERING"): (REFUSED, None, "a recovery is open"),
    ("stop", "RECOVERING_SEEKED"): (REFUSED, None, "a recovery is open"),
    ("finalize", "READY"): (SAME, Status.READY, None),
    ("finalize", "STOPPING"): (CHANGE, Status.STOPPED, None),
    ("finalize", "STOPPED"): (SAME, Status.STOPPED, None),
    ("finalize", "RECOVERING"): (SAME, Status.RECOVERING, None),
    ("finalize", "RECOVERING_SEEKED"): (SAME, Status.RECOVERING, None),
    ("resume", "READY"): (SAME, Status.READY, None),
    ("resume", "STOPPING"): (REFUSED, None, "the stop is still finishing"),
    ("resume", "STOPPED"): (CHANGE, Status.READY, None),
    ("resume", "RECOVERING"): (REFUSED, None, "use recover resume after recover seek"),
    ("resume", "RECOVERING_SEEKED"): (REFUSED, None, "use recover resume after recover seek"),
    ("recover begin", "READY"): (CHANGE, Status.RECOVERING, None),
    ("recover begin", "STOPPING"): (REFUSED, None, "a stop is finishing"),
    ("recover begin", "STOPPED"): (CHANGE, Status.RECOVERING, None),
    ("recover begin", "RECOVERING"): (REFUSED, None, f"recovery epoch {EPOCH} is already open"),
    ("recover begin", "RECOVERING_SEEKED"): (REFUSED, None, f"recovery epoch {EPOCH} is already open"),
    ("recover seek", "READY"): (REFUSED, None, "no recovery is open"),
    ("recover seek", "STOPPING"): (REFUSED, None, "no recovery is open"),
    ("recover seek", "STOPPED"): (REFUSED, None, "no recovery is open"),
    ("recover seek", "RECOVERING"): (CHANGE, Status.RECOVERING, None),
    # Seeking again in the same epoch re-verifies and records the position again.
    ("recover seek", "RECOVERING_SEEKED"): (CHANGE, Status.RECOVERING, None),
    ("recover resume", "READY"): (REFUSED, None, "no recovery is open"),
    ("recover resume", "STOPPING"): (REFUSED, None, "no recovery is open"),
    ("recover resume", "STOPPED"): (REFUSED, None, "no recovery is open"),
    ("recover resume", "RECOVERING"): (REFUSED, None, f"recovery epoch {EPOCH} has no seek"),
    ("recover resume", "RECOVERING_SEEKED"): (CHANGE, Status.READY, None),
}


def test_the_table_names_every_transition_from_every_state():
    assert set(TABLE) == {(t, s) for t in TRANSITIONS for s in STATES}


@pytest.mark.parametrize("action,start", sorted(TABLE), ids=lambda v: v.replace(" ", "-"))
def test_transition_from_every_status(action, start):
    current = STATES[start]
    outcome, status_after, refusal = TABLE[(action, start)]
    decision = TRANSITIONS[action](current)
    assert decision.action == action
    assert decision.current == current
    if outcome == REFUSED:
        assert decision.new is None and not decision.changes
        # The refusal names the transition, the shard, the phrase saying why, and the state
        # the stream is in with who put it there.
        assert decision.refusal.startswith(f"{action} of shard 'orders' refused: ")
        assert refusal in decision.refusal
        assert f"{current.status.value} (epoch {EPOCH}), set by earlier" in decision.refusal
        return
    assert decision.refusal is None
    if outcome == SAME:
        assert decision.new is None and not decision.changes
        assert current.status is status_after
        return
    new = decision.new
    assert decision.changes and new.status is status_after
    # Every change bumps the version by one (the compare-and-set's key) and says who, when.
    assert (new.shard_id, new.version, new.changed_by, new.changed_at) == ("orders", 4, ACTOR, NOW)
    if action == "recover begin":
        assert new.epoch == next_epoch(EPOCH, NOW) > EPOCH
        assert (new.seeked_epoch, new.seek_position) == (None, None)
        assert new.reason == "lost store"
    elif action == "recover seek":
        assert (new.epoch, new.seeked_epoch, new.seek_position) == (EPOCH, EPOCH, POSITION)
    else:
        assert new.epoch == current.epoch and new.seeked_epoch == current.seeked_epoch
    if action == "finalize":
        # The finalized stop keeps the reason the stop gave.
        assert new.reason == current.reason


# -- finalize acts only on the version it read --------------------------------------------------


def test_finalize_with_a_stale_version_changes_nothing():
    read = state(Status.STOPPING, version=4)
    # Finalized, resumed and stopped again since: STOPPING, but not the stop this finalizer read.
    current = replace(read, version=7, changed_by="someone else")
    decision = decide_finalize(current, read, ACTOR, NOW)
    assert decision.refusal is None and decision.new is None
    assert decision.current == current


@pytest.mark.parametrize("moved_to", [Status.READY, Status.STOPPED, Status.RECOVERING])
def test_finalize_after_the_status_moved_changes_nothing(moved_to):
    read = state(Status.STOPPING, version=4)
    for version in (4, 5):  # a moved status is enough, whatever the version says
        decision = decide_finalize(replace(read, status=moved_to, version=version), read, ACTOR, NOW)
        assert decision.refusal is None and decision.new is None


def test_finalize_of_a_shard_that_is_gone_is_refused_with_the_reason():
    read = state(Status.STOPPING, version=4)
    decision = decide_finalize(None, read, ACTOR, NOW)
    assert decision.new is None
    assert "finalize of shard 'orders' refused: the shard no longer exists" in decision.refusal


# -- seek and resume belong to one epoch --------------------------------------------------------


def test_seek_names_its_epoch_and_refuses_another():
    open_recovery = STATES["RECOVERING"]
    ok = decide_seek(open_recovery, EPOCH, POSITION, ACTOR, NOW)
    assert ok.new.seeked_epoch == EPOCH
    other = decide_seek(open_recovery, EPOCH - 1, POSITION, ACTOR, NOW)
    assert other.new is None
    assert f"asked for epoch {EPOCH - 1}, but the open recovery is epoch {EPOCH}" in other.refusal


def test_resume_needs_the_seek_of_this_very_epoch():
    # The seek of an earlier recovery does not count for the one open now.
    earlier = state(Status.RECOVERING, seeked_epoch=EPOCH - 5)
    refused = decide_resume_after_recovery(earlier, None, ACTOR, NOW)
    assert refused.new is None
    assert f"recovery epoch {EPOCH} has only the seek of epoch {EPOCH - 5}: run recover seek first" in refused.refusal
    seeked = STATES["RECOVERING_SEEKED"]
    assert decide_resume_after_recovery(seeked, EPOCH, ACTOR, NOW).new.status is Status.READY
    wrong = decide_resume_after_recovery(seeked, EPOCH + 1, ACTOR, NOW)
    assert wrong.new is None and f"asked for epoch {EPOCH + 1}" in wrong.refusal


def test_a_new_recovery_forgets_the_previous_seek():
    seeked = STATES["RECOVERING_SEEKED"]
    resumed = decide_resume_after_recovery(seeked, EPOCH, ACTOR, NOW).new
    reopened = decide_begin_recovery(resumed, ACTOR, NOW + 1, "again").new
    assert reopened.epoch > EPOCH and reopened.seeked_epoch is None and reopened.seek_position is None
    assert decide_resume_after_recovery(reopened, None, ACTOR, NOW + 2).refusal is not None


# -- fencing ------------------------------------------------------------------------------------


@pytest.mark.parametrize("start", sorted(STATES))
def test_fence_for_each_status_in_the_writers_epoch(start):
    current = STATES[start]
    why = fence(current, EPOCH)
    if current.status in (Status.READY, Status.STOPPING):
        # STOPPING lets the batch in hand commit.
        assert why is None
    else:
        assert why == f"the stream is {current.describe()}"


def test_fence_refuses_a_writer_of_another_epoch_even_when_ready():
    after_recovery = state(Status.READY, epoch=EPOCH + 10)
    why = fence(after_recovery, EPOCH)
    assert why.startswith(f"a recovery began after this writer started (writer epoch {EPOCH}, stream READY")
    assert fence(state(Status.STOPPING, epoch=EPOCH + 10), EPOCH) is not None
    # A commit that carries no epoch (maintenance, old callers) is fenced by status only.
    assert fence(after_recovery, None) is None
    assert fence(STATES["STOPPED"], None) is not None


def test_only_a_ready_stream_starts_a_run():
    for name, current in STATES.items():
        why = refuse_start(current)
        if name == "READY":
            assert why is None
        else:
            assert why == f"shard 'orders' is not READY: the stream is {current.describe()}"


def test_describe_says_who_set_the_status_when_and_why():
    text = state(Status.STOPPED).describe()
    assert text.startswith(f"STOPPED (epoch {EPOCH}), set by earlier at 2027-01-15T")
    assert text.endswith(": before")
    assert initial_state("orders").describe() == "READY (epoch 0)"


# -- epochs -------------------------------------------------------------------------------------


def test_next_epoch_is_the_time_in_ms_and_strictly_increasing():
    assert next_epoch(0, NOW) == int(NOW * 1000)
    # A clock that stands still or goes backwards still gives a larger epoch.
    epoch = 0
    for now in (NOW, NOW, NOW - 3600, NOW + 0.0001, NOW - 1e6, NOW + 5):
        following = next_epoch(epoch, now)
        assert following > epoch
        assert following >= int(now * 1000)
        epoch = following
    assert next_epoch(EPOCH, NOW) == int(NOW * 1000)
    assert next_epoch(int(NOW * 1000) + 7, NOW) == int(NOW * 1000) + 8


def test_restore_opens_a_recovery_above_every_previous_epoch():
    # Into an empty store: RECOVERING, epoch the time of the restore (so above any epoch a
    # lost store handed out earlier).
    fresh = decide_restore(None, "orders", ACTOR, NOW, "restored at upper 4")
    assert (fresh.status, fresh.version, fresh.epoch) == (Status.RECOVERING, 1, int(NOW * 1000))
    assert (fresh.seeked_epoch, fresh.changed_by, fresh.reason) == (None, ACTOR, "restored at upper 4")
    # Over a stream whose epoch is ahead of this clock: still above it.
    ahead = state(Status.RECOVERING, version=9, epoch=int(NOW * 1000) + 500, seeked_epoch=int(NOW * 1000) + 500)
    restored = decide_restore(ahead, "orders", ACTOR, NOW, "again")
    assert restored.epoch == ahead.epoch + 1
    assert restored.version == 10
    assert (restored.seeked_epoch, restored.seek_position) == (None, None)
    assert decide_resume_after_recovery(restored, None, ACTOR, NOW).refusal is not None


def test_a_stop_stands_while_its_stopping_is_current_or_the_stream_is_stopped():
    from airflow_upsert_provider.engine.store.stream_rules import stop_superseded

    ready = replace(initial_state("s"), version=3)
    stopping = decide_stop(ready, ACTOR, NOW).new
    assert stop_superseded(stopping, stopping) is None
    stopped = decide_finalize(stopping, stopping, "someone else", NOW).new
    assert stop_superseded(stopping, stopped) is None  # what was asked for, whoever finalized it
    resumed = decide_resume(stopped, "other", NOW + 1, "back").new
    why = stop_superseded(stopping, resumed)
    assert why is not None and "superseded" in why and "READY" in why and "writers may run" in why
    recovering = decide_begin_recovery(stopped, "other", NOW + 1).new
    assert "RECOVERING" in stop_superseded(stopping, recovering)
    # Another stop's STOPPING (a later version) is not this stop's.
    restopped = decide_stop(resumed, "other", NOW + 2).new
    assert stop_superseded(stopping, restopped) is not None


def test_a_batch_in_hand_with_no_sign_of_a_writer_for_the_idle_time_is_not_waited_for():
    from airflow_upsert_provider.engine.store.stream_rules import DRAIN_IDLE_SECONDS, writer_may_be_working

    assert writer_may_be_working(NOW - 1, NOW)
    assert writer_may_be_working(NOW - DRAIN_IDLE_SECONDS + 1, NOW)
    assert not writer_may_be_working(NOW - DRAIN_IDLE_SECONDS, NOW)
    assert not writer_may_be_working(NOW - 3600, NOW, idle_seconds=60)
