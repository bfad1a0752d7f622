"""`upsertctl` with faults injected around the compare-and-set, for multi-process tests.

Environment:
  RACE_SEED, RACE_MAX_DELAY  random delay (seconds) before staging and before each append
  RACE_BARRIER=DIR:N         before its first append, wait until N writers have staged a batch
                             (each leaves a file in DIR): they all hold batch 0 and race for it,
                             however far apart their JVMs started
  FAULT=exit_before_cas      stage, then die (os._exit) before the compare-and-set
  FAULT=hang_after_stage     stage, then wait to be killed before the compare-and-set
  FAULT=wait_after_stage     stage the first batch, print "STAGED <run path>" on stderr, and
                             hold its compare-and-set until the file RACE_RELEASE exists
"""

from __future__ import annotations

import os
import random
import sys
import time

from airflow_upsert_provider import cli
from airflow_upsert_provider.engine.write import writer as writer_module

rng = random.Random(int(os.environ.get("RACE_SEED", "0")))
max_delay = float(os.environ.get("RACE_MAX_DELAY", "0"))
fault = os.environ.get("FAULT", "")
barrier = os.environ.get("RACE_BARRIER", "")
release = os.environ.get("RACE_RELEASE", "")
# A writer that never reaches the barrier (it failed) must not hang the others for ever.
BARRIER_TIMEOUT = 600.0
real_append = writer_module.Writer.append
real_stage = writer_module.Writer.stage


def stage(self, ts):
    time.sleep(rng.uniform(0, max_delay))
    return real_stage(self, ts)


def wait_at_barrier() -> None:
    directory, writers = barrier.rsplit(":", 1)
    open(os.path.join(directory, str(os.getpid())), "w").close()
    deadline = time.monotonic() + BARRIER_TIMEOUT
    while len(os.listdir(directory)) < int(writers) and time.monotonic() < deadline:
        time.sleep(0.01)


def append(self, staged):
    global barrier, fault
    if barrier:
        wait_at_barrier()
        barrier = ""
    if fault == "exit_before_cas":
        sys.stdout.flush()
        os._exit(9)
    if fault == "hang_after_stage":
        print(f"STAGED {staged.run['path']}", file=sys.stderr, flush=True)
        time.sleep(600)
    if fault == "wait_after_stage":
        fault = ""  # the first batch only: a restaged one commits at once
        print(f"STAGED {staged.run['path']}", file=sys.stderr, flush=True)
        deadline = time.monotonic() + BARRIER_TIMEOUT
        while not os.path.exists(release) and time.monotonic() < deadline:
            time.sleep(0.01)
    time.sleep(rng.uniform(0, max_delay))
    return real_append(self, staged)


writer_module.Writer.stage = stage
writer_module.Writer.append = append

if __name__ == "__main__":
    sys.exit(cli.main(sys.argv[1:]))
