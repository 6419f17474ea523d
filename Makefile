# The two commands a new user types: `make demo` and `make test`. Each sets up everything first.
SHELL := /bin/bash
include scripts/versions.env
CLUSTER_VENV := .venv
AIRFLOW_VENV := .venv-airflow
OLDEST_VENV := .venv-airflow-oldest
DOCS_VENV := .venv-docs
# Airflow's home, database and logs stay inside the checkout, in an ignored folder.
export AIRFLOW_HOME := $(CURDIR)/.airflow
export AIRFLOW__CORE__LOAD_EXAMPLES := False
export AIRFLOW__CORE__DAGS_FOLDER := $(CURDIR)/dags
export AIRFLOW__CORE__UNIT_TEST_MODE := False
# The tests reach the Ray head they start from the cluster's environment.
export AHP_CLUSTER_PYTHON := $(CURDIR)/$(CLUSTER_VENV)/bin/python
PYTEST := -p no:cacheprovider --durations=15
# The environments are installed --no-compile, so Python caches the bytecode of a module when it is
# first imported, unless PYTHONDONTWRITEBYTECODE is set (this machine's image sets it). Then every
# process, each Ray worker of each job included, compiles all it imports again, at about twice the CPU
# of an import from the cache (bench/results.md, figure 10).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: setup setup-test demo ui-check lint docs check test compat bench chaos clean

# Independent set-up steps run side by side (scripts/run_parallel.sh fails if any of them does).
setup:
	@scripts/run_parallel.sh scripts/setup_cluster_env.sh scripts/build_ui.sh

setup-test: setup
	@scripts/run_parallel.sh scripts/setup_debian_packages.sh scripts/setup_mlflow_server.sh \
	  "scripts/setup_airflow_env.sh $(AIRFLOW_VENV) $(PYTHON_AIRFLOW) $(AIRFLOW) amazon,openlineage,test" \
	  "scripts/setup_airflow_env.sh $(OLDEST_VENV) $(PYTHON_AIRFLOW_OLDEST) $(AIRFLOW_OLDEST) test" \
	  scripts/setup_ray_layer.sh

demo: setup
	@scripts/demo.sh

# The Training views' JavaScript: ESLint, and node's own test runner over the charts' options.
ui-check: setup
	scripts/check_ui.sh

# Lint, import order and the line length (ruff), and types (mypy) of the package; the views' JavaScript.
lint: setup-test ui-check
	$(AIRFLOW_VENV)/bin/ruff check .
	$(AIRFLOW_VENV)/bin/ruff format --check .
	$(AIRFLOW_VENV)/bin/mypy

# The documentation site (mkdocs.yml: docs/, the README as its home page, the API reference read from the
# docstrings) into .build/site. --strict: a broken link or anchor, a page left out of the nav or a reference
# that does not resolve fails it. Its tools are pyproject.toml's `docs` group, in an environment of their own.
docs:
	@scripts/setup_docs_env.sh $(DOCS_VENV) $(PYTHON_CLUSTER)
	NO_MKDOCS_2_WARNING=1 $(DOCS_VENV)/bin/mkdocs build --strict

# The development loop, in under a minute: the checks above, the documentation site, and the unit tests of
# both sides (no Ray head, no training) side by side, the Airflow side's in two workers, its property tests
# on a quarter of their cases (tests/unit/properties/conftest.py). `make test` runs everything, in full.
check: export AHP_HYPOTHESIS_PROFILE := check
check: lint docs
	@scripts/run_parallel.sh "$(AIRFLOW_VENV)/bin/pytest -p no:cacheprovider -q -n 2 tests/unit --ignore=tests/unit/runtime" \
	  "$(CLUSTER_VENV)/bin/python -m pytest -p no:cacheprovider -q tests/unit/runtime"

# The runs side by side (scripts/run_tests.sh says which and why): the cluster side's own tests in its
# environment; everything else from Airflow's environment (the provider from its wheel) against Ray
# heads started from the cluster's; the multi-host tests; and the oldest supported Airflow's share. Test
# files stay in the checkout; each run's log is in .test-airflow/logs; the slowest tests are listed.
test: lint
	@scripts/run_tests.sh

# Every tested Ray minor and the oldest and newest torch against the same checks (long: about 3 minutes a
# minor, and a Horovod compile per torch and Python the first time); writes docs/compatibility.md.
compat: setup-test
	$(AIRFLOW_VENV)/bin/python scripts/compat_matrix.py

# Benchmarks (not tests): writes bench/results.md, raw data in bench/out/.
bench: setup
	$(CLUSTER_VENV)/bin/python -m bench.run

# Faults at random under load, on a deployment as users run one (not part of `make test`; needs root):
# CHAOS_MINUTES (20) of workload and faults from CHAOS_SEED (drawn and printed when not given), then the
# invariants; bench/out/chaos.json and the figure in bench/results.md (chaos/README.md). CHAOS_DEPLOYMENT:
# single (the default: Airflow on one host, LocalExecutor) or spread (Celery workers, the triggerer and
# Ray on hosts of their own, Redis as the broker; partitions, lossy links, PostgreSQL and broker restarts).
chaos: setup-test
	$(AIRFLOW_VENV)/bin/python -m chaos

# docker/ run for real (not part of `make test`: its builds take long; needs root or a running Docker engine):
# both images built from their Dockerfiles, docker/compose.yaml brought up and checked through its containers,
# then taken down (scripts/docker_test.sh; DOCKER_TEST_IMAGES=real pulls the real base images: docker/README.md).
.PHONY: docker-test
docker-test:
	@scripts/setup_airflow_env.sh $(AIRFLOW_VENV) $(PYTHON_AIRFLOW) $(AIRFLOW) amazon,openlineage,test
	scripts/docker_test.sh

clean:
	-$(CLUSTER_VENV)/bin/python -m airflow_provider_horovod.local down
	rm -rf .airflow .pytest_cache .build
