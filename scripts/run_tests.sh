#!/usr/bin/env bash
# `make test`'s runs, two at a time. Each run is a pytest session that starts its own Ray head (or
# hosts, or Airflow deployment), so runs share nothing but the machine; the machine has two cores and a
# training keeps about one busy, so two at a time keep both at work without the timeouts that more
# would bring. Two workers take the runs from one queue, longest first by their measured times, so
# neither waits on the other at the end.
#
#   main      most of the tests, from Airflow's environment (the provider installed from its wheel)
#   stack     the tests of one Airflow deployment (api-server, scheduler, dag-processor, triggerer on
#             PostgreSQL) and of both trainer APIs resuming a killed worker, from Airflow's environment
#   cluster   the cluster side's own tests, in its environment (Ray, torch, Horovod)
#   rayold    the oldest tested Ray minor (laid over the cluster's environment): its cluster-side probes
#             and the operator's checks that depend on Ray's behaviour
#   hosts     the multi-host tests (their own hosts, made of network namespaces, and their own cluster):
#             both trainer APIs across hosts, host loss, elastic resizing, GPU workers' devices, a script's
#             ranks against horovodrun's
#   oldest    the oldest supported Airflow's share, and the tests marked oldest_airflow_only (which
#             the main run leaves out: other tests check their parts on the newest Airflow)
#
# Each run's output goes to .test-airflow/logs/<run>.log; a failed run's tail is printed. At the end:
# each run's result, the total time and the slowest tests (wall, and the machine's CPU meanwhile).
set -uo pipefail
cd "$(dirname "$0")/.."

logs=.test-airflow/logs
export AHP_TIMINGS_DIR=.test-airflow/timings
rm -rf "$logs" "$AHP_TIMINGS_DIR"
mkdir -p "$logs"
pytest_args="-p no:cacheprovider -q -r fEs"
airflow=".venv-airflow/bin/pytest $pytest_args"
# The Ray Train tests first: the deployment starts with the first test that needs it, and idles no longer.
stack_files="tests/integration/test_horovod_v2.py tests/integration/test_stack.py tests/integration/test_training_view.py"
hosts_files="tests/integration/test_multihost.py tests/integration/test_multihost_scripts.py"
ray_layer=$(scripts/setup_ray_layer.sh) || exit 1

declare -A commands=(
  [main]="$airflow --basetemp=.test-airflow/pytest -m 'not cross_python and not oldest_airflow_only' tests --ignore=tests/unit/runtime \
    $(printf -- '--ignore=%s ' $hosts_files $stack_files)"
  [stack]="$airflow --basetemp=.test-airflow/pytest-stack -m 'not cross_python' $stack_files"
  [cluster]=".venv/bin/python -m pytest $pytest_args --basetemp=.test-airflow/pytest-cluster tests/unit/runtime"
  [rayold]="PYTHONPATH=$ray_layer .venv/bin/python -m pytest $pytest_args --basetemp=.test-airflow/pytest-cluster-rayold \
    tests/unit/runtime/test_ray_compat.py && AHP_RAY_VERSIONS=1 AHP_CLUSTER_PYTHONPATH=$ray_layer $airflow \
    --basetemp=.test-airflow/pytest-rayold -m ray_oldest tests/integration/test_ray_versions.py"
  [hosts]="$airflow --basetemp=.test-airflow/pytest-hosts $hosts_files"
  [oldest]=".venv-airflow-oldest/bin/pytest $pytest_args --basetemp=.test-airflow/pytest-oldest \
    -m 'oldest_airflow or oldest_airflow_only or cross_python' tests/integration"
)
# Longest first (wall seconds on this machine, two at a time): main ~1030, stack ~480, hosts ~300,
# oldest ~190, rayold ~110, cluster ~15.
order=(main stack hosts oldest rayold cluster)
queue=$logs/queue
printf '%s\n' "${order[@]}" >"$queue"
next_run() { flock "$queue.lock" bash -c 'head -n 1 "$0"; sed -i 1d "$0"' "$queue"; }

started=$(date +%s)
pids=()
for _ in 1 2; do
  (
    while run=$(next_run) && [ -n "$run" ]; do
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
  tail -n 150 "$logs/$run.log"
done
printf '\nmake test: the runs took %d s, two at a time.\n\n' "$(($(date +%s) - started))"
.venv-airflow/bin/python tests/support/timing.py "$AHP_TIMINGS_DIR" 20 || true
[ ${#failed[@]} -eq 0 ]
