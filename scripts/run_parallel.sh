#!/usr/bin/env bash
# Runs steps side by side (set-up waits on downloads as much as on the cores; make check's two unit
# test runs leave each other idle moments), each line
# of their output prefixed with the step's name (its script's, and its first argument), and fails,
# naming each step that failed, when any did: no half-built environment passes for a built one.
#
# Usage: scripts/run_parallel.sh 'COMMAND [ARGS]' 'COMMAND [ARGS]' ...   (each a line for bash -c)
set -uo pipefail
pids=() names=()
for step in "$@"; do
  # The script's name, and its first argument where it has one (which environment).
  read -r cmd arg _ <<<"$step"
  name=$(basename "$cmd" .sh)${arg:+ $arg}
  # sed -u: lines as they come, not at the end.
  (bash -c "$step" 2>&1 | sed -u "s|^|[$name] |") &
  pids+=($!) names+=("$name")
done
failed=()
for i in "${!pids[@]}"; do
  wait "${pids[$i]}" || failed+=("${names[$i]}")
done
if [ ${#failed[@]} -gt 0 ]; then
  (IFS=,; echo "failed: ${failed[*]} (see the lines prefixed with its name above)" >&2)
  exit 1
fi
