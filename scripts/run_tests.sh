#!/usr/bin/env bash
# `make test`'s runs, in two streams side by side: each run starts its own Ray head (or hosts, or
# Airflow), so they share nothing but the machine. AHP_TEST_WORKERS=N splits the main run into N
# pytest-xdist workers (the tests that share one Airflow deployment, the `stack` fixture, on one).
#
#   cluster   the cluster side's own tests, in its environment (Ray, torch, Horovod)
#   airflow   everything else from Airflow's environment (the provider from its wheel)
#   hosts     the multi-host tests (their own hosts, made of network namespaces, and their own cluster)
#   oldest    the oldest supported Airflow's share
#
# Each run's output goes to .test-airflow/logs/<run>.log; a failed run's tail is printed. At the end:
# each run's result, the total time and the slowest tests (wall, and the machine's CPU meanwhile).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/versions.env

logs=.test-airflow/logs
export AHP_TIMINGS_DIR=.test-airflow/timings
rm -rf "$logs" "$AHP_TIMINGS_DIR"
mkdir -p "$logs"
common=(-p no:cacheprovider -q -r fEs)
workers=${AHP_TEST_WORKERS:-1}

declare -A commands=(
  [cluster]=".venv/bin/python -m pytest ${common[*]} --basetemp=.test-airflow/pytest-cluster tests/unit/runtime"
  [airflow]=".venv-airflow/bin/pytest ${common[*]} --basetemp=.test-airflow/pytest -n $workers --dist loadgroup -m 'not cross_python' tests --ignore=tests/unit/runtime --ignore=tests/integration/test_multihost.py"
  [hosts]=".venv-airflow/bin/pytest ${common[*]} --basetemp=.test-airflow/pytest-hosts tests/integration/test_multihost.py"
  [oldest]=".venv-airflow-oldest/bin/pytest ${common[*]} --basetemp=.test-airflow/pytest-oldest -m 'oldest_airflow or cross_python' tests/integration"
)
# Two streams (the machine has two cores, and a training keeps one busy): the main run, and beside it
# the others one after another.
streams=("airflow" "cluster hosts oldest")
order=(airflow cluster hosts oldest)

started=$(date +%s)
pids=()
for stream in "${streams[@]}"; do
  (
    for run in $stream; do
      AHP_TIMINGS_NAME=$run bash -c "${commands[$run]}" >"$logs/$run.log" 2>&1
      echo $? >"$logs/$run.status"
    done
  ) &
  pids+=($!)
done
wait "${pids[@]}"

failed=()
for run in "${order[@]}"; do
  if [ "$(cat "$logs/$run.status" 2>/dev/null)" = 0 ]; then status=passed; else status=FAILED; failed+=("$run"); fi
  printf '%-8s %-6s %s\n' "$run" "$status" "$(grep -E ' in [0-9.]+s' "$logs/$run.log" | tail -1 | tr -d '=')"
done
for run in "${failed[@]}"; do
  printf '\n===== %s: the end of %s =====\n' "$run" "$logs/$run.log"
  tail -n 120 "$logs/$run.log"
done
printf '\nmake test: the runs took %d s side by side.\n\n' "$(($(date +%s) - started))"
.venv-airflow/bin/python tests/support/timing.py "$AHP_TIMINGS_DIR" 20 || true
[ ${#failed[@]} -eq 0 ]
