#!/usr/bin/env bash
# The one test command: installs what is missing, then runs types, lint, unit tests and
# integration tests (against a real kube-apiserver + etcd, the cocoon simulator and CNCF
# distribution v3; Debian's docker-registry 2.8 where a test needs its quirks).
# Usage: npm test [-- <test file or glob> ...]
set -euo pipefail
# The suite's summary line reports the wall time since here (ground/run-tests.ts).
export VK_SUITE_T0="${VK_SUITE_T0:-$(date +%s%3N)}"
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
# Unit test files only (`npm test -- test/unit/x.test.ts`): no cluster, registry, simulator or
# Go build is needed, so only the npm packages (with Node.js 24) are installed, and the files
# run under node --test directly.
if [ $# -gt 0 ]; then
  unit_only=1
  for a in "$@"; do case "$a" in test/unit/*) ;; *) unit_only= ;; esac; done
  if [ -n "$unit_only" ]; then
    VK_SETUP_NODE_ONLY=1 bash scripts/setup.sh
    exec node_modules/.bin/node --test --test-reporter=spec "$@"
  fi
fi
bash scripts/setup.sh
export PATH="$root/node_modules/.bin:$PATH"
node -e 'console.log(`node ${process.version}`); if (!process.version.startsWith("v24.")) process.exit(1)'
echo "kubernetes: $(head -1 "$(bash scripts/testbin.sh 2>/dev/null)/VERSION")"
VK_CRANE_BIN="$(bash scripts/cranebin.sh | tail -1)/crane"; export VK_CRANE_BIN; echo "crane: $("$VK_CRANE_BIN" version) (registry conformance client, scripts/cranebin.sh)"
VK_ORAS_BIN="$(bash scripts/orasbin.sh | tail -1)/oras"; export VK_ORAS_BIN; echo "oras: $(head -1 "$(dirname "$VK_ORAS_BIN")/VERSION" | tr -s ' ') (second independent OCI client: v2 vectors, scripts/orasbin.sh)"
VK_DISTRIBUTION_BIN="$(bash scripts/distributionbin.sh | tail -1)/registry"; export VK_DISTRIBUTION_BIN; echo "registry: $(cat "$(dirname "$VK_DISTRIBUTION_BIN")/VERSION") (the ground's default, scripts/distributionbin.sh; VK_REGISTRY_KIND=docker-registry for Debian's 2.8)"
VK_METRICS_SERVER_BIN="$(bash scripts/metricsserverbin.sh | tail -1)/metrics-server"; export VK_METRICS_SERVER_BIN; echo "$(cat "$(dirname "$VK_METRICS_SERVER_BIN")/VERSION") (kubectl top, scripts/metricsserverbin.sh)"
if [ $# -gt 0 ]; then
  exec node ground/run-tests.ts "$@"
fi
# The typecheck (about 20 s of one core) runs beside the suite instead of before it: the
# suite's first minute is mostly waiting on VMs and the apiserver. Its failure still fails the
# run; its output and the suite's closing line come last.
checks="$(mktemp -d)"
echo "== typecheck (beside the tests; reported at the end)"
( tsc --noEmit -p . >"$checks/tsc.log" 2>&1; echo $? >"$checks/tsc.rc" ) &
tsc_pid=$!
trap 'kill "$tsc_pid" 2>/dev/null || true; rm -rf "$checks"' EXIT
echo "== lint"; biome check --reporter=summary .
set +e
node ground/run-tests.ts 2>&1 | tee "$checks/suite.log"
rc=${PIPESTATUS[0]}
wait "$tsc_pid"
set -e
echo "== typecheck"
cat "$checks/tsc.log"
if [ "$(cat "$checks/tsc.rc" 2>/dev/null)" != 0 ]; then
  echo "typecheck FAILED (tsc --noEmit -p .)"
  rc=1
fi
# The suite's closing line, last (CI reads it).
grep -E '^suite: [0-9]+ passed, [0-9]+ failed' "$checks/suite.log" | tail -1
exit "$rc"
