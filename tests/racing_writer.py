"""`upsertctl` with faults injected around the compare-and-set, for multi-process tests.

Environment:
  RACE_SEED, RACE_MAX_DELAY  random delay (seconds) before staging and before each append
  FAULT=exit_before_cas      stage, then die (os._exit) before the compare-and-set
  FAULT=hang_after_stage     stage, then wait to be killed before the compare-and-set
"""

from __future__ import annotations

import os
import random
import sys
import time

from airflow_upsert_provider import cli
from airflow_upsert_provider.engine import writer as writer_module

rng = random.Random(int(os.environ.get("RACE_SEED", "0")))
max_delay = float(os.environ.get("RACE_MAX_DELAY", "0"))
fault = os.environ.get("FAULT", "")
real_append = writer_module.Writer.append
real_stage = writer_module.Writer.stage


def stage(self, ts):
    time.sleep(rng.uniform(0, max_delay))
    return real_stage(self, ts)


def append(self, staged):
    if fault == "exit_before_cas":
        sys.stdout.flush()
        os._exit(9)
    if fault == "hang_after_stage":
        print(f"STAGED {staged.run['path']}", file=sys.stderr, flush=True)
        time.sleep(600)
    time.sleep(rng.uniform(0, max_delay))
    return real_append(self, staged)


writer_module.Writer.stage = stage
writer_module.Writer.append = append

if __name__ == "__main__":
    sys.exit(cli.main(sys.argv[1:]))
