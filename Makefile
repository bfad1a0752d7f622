# Both entry points bootstrap .venv when it is missing (or pyproject.toml changed), then run.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?=
# The slowest tests of each pytest process, so that a suite growing slow shows where.
DURATIONS ?= --durations=25
# The main suite runs on this many pytest-xdist workers, each with its own SparkSession,
# PostgreSQL server and Airflow home; whole modules go to a worker (--dist loadfile), so a
# module's shared batches are built once, in the order tests/conftest.py gives them (the
# modules of slow tests first) instead of xdist's largest-module-first. Three on two cores:
# a worker spends part of its time waiting on the processes its tests start (a JVM's or an
# Airflow process's start, a held writer), which a third worker fills (the main suite in
# 13:38 against 14:23 with two, docs/performance.md); each worker holds about 2-3 GB.
WORKERS ?= 3

.PHONY: demo test test-fast bench soak docs-images check-java clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	@touch $(STAMP)

check-java:
	@command -v java >/dev/null || { echo "Java 17+ is required by PySpark 4 (apt-get install openjdk-17-jre-headless)"; exit 2; }
	@java -version 2>&1 | awk -F'"' '/version/ { split($$2, v, "."); if (v[1] < 17) { print "Java " $$2 " found; PySpark 4 needs 17+"; exit 2 } }'

demo: $(STAMP) check-java
	$(BIN)/python demo/demo.py

# Two pytest runs: tests/connect runs the engine through a Spark Connect server, and a
# process that holds an in-process SparkSession cannot also hold a Connect one (it runs on
# one process: its tests share one Connect server). Either run
# failing, or collecting nothing (exit 5), fails the target. The last line gives each
# process's wall time and their total (pytest reports each process's own only).
test: $(STAMP) check-java
	@start=$$(date +%s); \
	$(BIN)/python -m pytest -ra $(DURATIONS) -n $(WORKERS) --dist loadfile --no-loadscope-reorder --ignore=tests/connect $(PYTEST_ARGS); main=$$?; \
	middle=$$(date +%s); \
	$(BIN)/python -m pytest -ra $(DURATIONS) tests/connect $(PYTEST_ARGS); connect=$$?; \
	end=$$(date +%s); \
	echo "make test: main suite exit $$main in $$((middle - start))s, tests/connect exit $$connect in $$((end - middle))s, total $$((end - start))s"; \
	test $$main -eq 0 && test $$connect -eq 0

# The fast set: no multi-process, cluster or Airflow end-to-end tests.
test-fast: $(STAMP) check-java
	@start=$$(date +%s); \
	$(BIN)/python -m pytest -ra $(DURATIONS) -m "not slow" -n $(WORKERS) --dist loadfile --no-loadscope-reorder --ignore=tests/connect $(PYTEST_ARGS); main=$$?; \
	middle=$$(date +%s); \
	$(BIN)/python -m pytest -ra $(DURATIONS) -m "not slow" tests/connect $(PYTEST_ARGS); connect=$$?; \
	end=$$(date +%s); \
	echo "make test-fast: main suite exit $$main in $$((middle - start))s, tests/connect exit $$connect in $$((end - middle))s, total $$((end - start))s"; \
	test $$main -eq 0 && test $$connect -eq 0

bench: $(STAMP) check-java
	$(BIN)/python bench/bench_upsert.py

# The long soak (docs/maintenance.md, "Soak"): 10,000 batches on a throwaway PostgreSQL with
# racing writers SIGKILLed at random; SOAK_ARGS passes options (e.g. --batches 2000 --seed 3).
soak: $(STAMP) check-java
	$(BIN)/python bench/soak.py --batches 10000 --writers 3 --kill-every 300 $(SOAK_ARGS)

# The shard page's screenshots in docs/img/ (docs/ui.md), taken by its browser test.
docs-images: $(STAMP) check-java
	UPSERT_DOCS_IMAGES=1 $(BIN)/python -m pytest -q -p no:cacheprovider tests/airflow/test_ui.py -k chromium

clean:
	rm -rf .upsert .demo spark-warehouse
