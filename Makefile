# The two commands a new user types: `make demo` and `make test`. Each sets up everything first.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
# Airflow's home, database and logs stay inside the checkout, in an ignored folder.
export AIRFLOW_HOME := $(CURDIR)/.airflow
export AIRFLOW__CORE__LOAD_EXAMPLES := False
export AIRFLOW__CORE__DAGS_FOLDER := $(CURDIR)/dags
export AIRFLOW__CORE__UNIT_TEST_MODE := False

.PHONY: setup demo test clean

setup:
	@scripts/setup_venv.sh

demo: setup
	@scripts/demo.sh

test: setup
	$(PY) -m pytest -p no:cacheprovider tests

clean:
	-$(PY) -m airflow_provider_horovod.local down
	rm -rf .airflow .pytest_cache
