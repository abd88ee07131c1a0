#!/usr/bin/env bash
# Runs the unit tests and the simulator tests N times in a row (default 10) while two busy
# loops load the machine, the check that no test depends on an idle machine
# (docs/test-ground.md, "Under load"). One line per run; exit 1 if any run failed. The busy
# loops are stopped however the script ends. A run past 20 minutes is stopped and counts as
# failed (exit 124).
# Usage: bash scripts/loaded-runs.sh [N]
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
n="${1:-10}"
case "$n" in ''|*[!0-9]*) echo "usage: bash scripts/loaded-runs.sh [N]" >&2; exit 2 ;; esac
VK_SETUP_NODE_ONLY= bash scripts/setup.sh >/dev/null || exit 1
node=node_modules/.bin/node
logs="$(mktemp -d -t vk-loaded-XXXXXX)"
busy=()
stop() { for p in "${busy[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; }
trap stop EXIT
trap 'exit 130' INT TERM
for _ in 1 2; do (while :; do :; done) & busy+=("$!"); done
echo "loaded-runs: $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo '+changes'), $(nproc) cores, two busy loops (pids ${busy[*]}), logs in $logs"
failed=0
for i in $(seq 1 "$n"); do
  for suite in unit sim; do
    if [ "$suite" = unit ]; then args=(--test --test-reporter=tap 'test/unit/**/*.test.ts'); else args=(--test --test-reporter=tap test/sim/); fi
    t0=$(date +%s)
    # A hang is a failed run (exit 124), not a script that never ends.
    timeout --kill-after=30 1200 "$node" "${args[@]}" >"$logs/$suite-$i.log" 2>&1
    rc=$?
    secs=$(( $(date +%s) - t0 ))
    pass=$(grep -E '^# pass ' "$logs/$suite-$i.log" | tail -1 | cut -d' ' -f3)
    fail=$(grep -E '^# fail ' "$logs/$suite-$i.log" | tail -1 | cut -d' ' -f3)
    load=$(cut -d' ' -f1 /proc/loadavg)
    echo "run $i $suite: rc=$rc pass=${pass:-?} fail=${fail:-?} ${secs}s load=$load"
    [ "$rc" = 0 ] || failed=$((failed + 1))
  done
done
echo "loaded-runs: $n runs of each, $failed failed"
[ "$failed" = 0 ]
