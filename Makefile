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
# one process: its tests share one Connect server). They run at the same time: the suite is
# CPU-bound and tests/connect's one process fills what the main suite's workers leave idle
# while they wait on the processes their tests start (15:37 for both against 16:34 one after
# the other, docs/performance.md). tests/connect's output goes to $(CONNECT_LOG) and is printed
# after the main suite's. Either run failing, or collecting nothing (exit 5), fails the
# target. The last line gives each run's wall time and the total.
CONNECT_LOG ?= .upsert-test/connect-tests.log
# $(1): the target's name, $(2): pytest arguments both runs take (a marker expression).
define run_suites
	@mkdir -p $(dir $(CONNECT_LOG)); rm -f $(CONNECT_LOG) $(CONNECT_LOG).exit; start=$$(date +%s); \
	( $(BIN)/python -m pytest -ra $(DURATIONS) $(2) tests/connect $(PYTEST_ARGS) >$(CONNECT_LOG) 2>&1; \
	  echo "$$? $$(date +%s)" >$(CONNECT_LOG).exit ) & connect_pid=$$!; \
	$(BIN)/python -m pytest -ra $(DURATIONS) $(2) -n $(WORKERS) --dist loadfile --no-loadscope-reorder --ignore=tests/connect $(PYTEST_ARGS); main=$$?; \
	middle=$$(date +%s); \
	wait $$connect_pid; \
	echo "== tests/connect, run beside the main suite (its log: $(CONNECT_LOG))"; cat $(CONNECT_LOG); \
	read connect connect_end <$(CONNECT_LOG).exit || { connect=1; connect_end=$$(date +%s); }; \
	end=$$(date +%s); \
	echo "make $(1): main suite exit $$main in $$((middle - start))s, tests/connect exit $$connect in $$((connect_end - start))s beside it, total $$((end - start))s"; \
	test $$main -eq 0 && test $$connect -eq 0
endef

test: $(STAMP) check-java
	$(call run_suites,test,)

# The fast set: no multi-process, cluster or Airflow end-to-end tests.
test-fast: $(STAMP) check-java
	$(call run_suites,test-fast,-m "not slow")

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
