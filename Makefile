# The two commands a new user types: `make demo` and `make test`. Each sets up everything first.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
# Airflow's home, database and logs stay inside the checkout, in an ignored folder.
export AIRFLOW_HOME := $(CURDIR)/.airflow
export AIRFLOW__CORE__LOAD_EXAMPLES := False
export AIRFLOW__CORE__DAGS_FOLDER := $(CURDIR)/dags
export AIRFLOW__CORE__UNIT_TEST_MODE := False

.PHONY: setup demo test bench clean

setup:
	@scripts/setup_venv.sh

demo: setup
	@scripts/demo.sh

# Test files (tmp_path) stay in the checkout too; the slowest tests are listed at the end.
test: setup
	$(PY) -m pytest -p no:cacheprovider --basetemp=.test-airflow/pytest --durations=15 tests

# Benchmarks (not tests): about 25 minutes on 2 cores; writes bench/results.md, raw data in bench/out/.
bench: setup
	$(PY) -m bench.run

clean:
	-$(PY) -m airflow_provider_horovod.local down
	rm -rf .airflow .pytest_cache
