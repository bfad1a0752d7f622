"""Run one DAG run with ``dag.test()`` for a fixed run: ``run_dag.py DAG_ID ISO_DATE [CONF_JSON]``.

Unlike ``airflow dags test`` (whose run id comes from the current time), the run id here is
fixed by the date, so running it again resumes the same DAG run: its task gets the next try
number, which is how the zombie test gets a retry.
"""

from __future__ import annotations

import json
import sys

from airflow.dag_processing.dagbag import DagBag
from airflow.sdk import timezone


def main() -> None:
    dag_id, date = sys.argv[1], timezone.parse(sys.argv[2])
    conf = json.loads(sys.argv[3]) if len(sys.argv) > 3 else None
    dag = DagBag().get_dag(dag_id)
    run = dag.test(logical_date=date, run_after=date, run_conf=conf)
    print(f"RUN {run.run_id} {run.state}", flush=True)


if __name__ == "__main__":
    main()
