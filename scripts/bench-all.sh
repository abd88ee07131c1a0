#!/usr/bin/env bash
# Every benchmark of docs/benchmarks.md, one after the other, at the current commit: the
# figures that page publishes come from one run of this script on a quiet machine.
#
# Usage: bash scripts/bench-all.sh OUT_DIR [FIGURES_DIR]
#   OUT_DIR      one log per bench (<name>.log, the bench's whole output) and run.txt (the
#                commit, the machine, each command with its start, end and exit code)
#   FIGURES_DIR  where the clone bench draws its SVG figures (default OUT_DIR/figures)
#
# A bench that fails is logged and the next one runs; the exit code is 1 when any failed.
# Each bench stops what it started (ground/proc.ts); this script starts nothing else.
set -u
out=${1:?usage: bash scripts/bench-all.sh OUT_DIR [FIGURES_DIR]}
figures=${2:-$out/figures}
cd "$(dirname "$0")/.."
mkdir -p "$out" "$figures"
export PATH="$PWD/node_modules/.bin:$PATH"
bash scripts/setup.sh

commit=$(git rev-parse --short HEAD)
dirty=$(git status --porcelain --untracked-files=no | head -1)
{
  echo "commit $commit${dirty:+ (uncommitted changes)}"
  echo "date $(date -u +%FT%TZ)"
  echo "machine $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(node --version)"
} > "$out/run.txt"

failed=0
bench() {
  local name=$1
  shift
  local start
  start=$(date +%s)
  echo "bench-all: [$(date -u +%T)] $name: $*"
  "$@" > "$out/$name.log" 2>&1
  local rc=$?
  echo "$name | $* | $(date -u -d @"$start" +%T) | $(date -u +%T) | exit $rc" >> "$out/run.txt"
  echo "bench-all: [$(date -u +%T)] $name: exit $rc ($(($(date +%s) - start)) s)"
  [ "$rc" = 0 ] || failed=1
}

bench clones node bench/clones.ts --release --figures "$figures" 100 300 1000
bench steady node bench/steady.ts
bench restart node bench/restart.ts
bench fairness node bench/fairness.ts
bench death node bench/vm-death.ts
bench fleet node bench/fleet.ts
bench fleet-soak node bench/fleet.ts soak
bench transfer node bench/transfer.ts
bench peer-wake node bench/peer-wake.ts
bench icmp node bench/icmp.ts
bench sim node bench/sim-call.ts
exit $failed
