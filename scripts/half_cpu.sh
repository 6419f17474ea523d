#!/usr/bin/env bash
# Runs a command, and everything it starts, on half of this machine's CPU time: a machine twice as slow.
# `scripts/half_cpu.sh make test` proves that the tests' time bounds do not hang on a fast machine's margin.
# How: a cgroup's CPU quota (v1's cpu controller, else v2's cpu.max). Needs root; refuses without it.
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: $0 COMMAND [ARG...]" >&2; exit 2; }
period=100000
quota=$(($(nproc) * period / 2))
name=ahp-half-cpu-$$
if [ -w /sys/fs/cgroup/cpu ]; then
  dir=/sys/fs/cgroup/cpu/$name
  mkdir "$dir" && echo "$quota" >"$dir/cpu.cfs_quota_us"
elif grep -qw cpu /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null; then
  dir=/sys/fs/cgroup/$name
  mkdir "$dir" && echo "$quota $period" >"$dir/cpu.max"
else
  echo "$0: no writable cgroup CPU controller here (run as root, with cgroup v1's cpu or v2's cpu enabled)" >&2
  exit 2
fi
# What the quota held back (throttled_time, ns), and the group gone once nothing of the command is left in it.
trap 'cat "$dir/cpu.stat" >&2; rmdir "$dir" 2>/dev/null || echo "$0: $dir still holds processes" >&2' EXIT
echo "$0: $(nproc) CPUs, quota ${quota}us every ${period}us ($dir)" >&2
rc=0
(echo "$BASHPID" >"$dir/cgroup.procs" && exec "$@") || rc=$?
exit $rc
