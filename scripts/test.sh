#!/usr/bin/env bash
# The one test command: installs what is missing, then runs types, lint, unit tests and
# integration tests (against a real kube-apiserver + etcd, the cocoon simulator and
# Debian's docker-registry). Usage: npm test [-- <test file or glob> ...]
set -euo pipefail
# The suite's summary line reports the wall time since here (ground/run-tests.ts).
export VK_SUITE_T0="${VK_SUITE_T0:-$(date +%s%3N)}"
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
bash scripts/setup.sh
export PATH="$root/node_modules/.bin:$PATH"
node -e 'console.log(`node ${process.version}`); if (!process.version.startsWith("v24.")) process.exit(1)'
echo "kubernetes: $(head -1 "$(bash scripts/testbin.sh 2>/dev/null)/VERSION")"
VK_CRANE_BIN="$(bash scripts/cranebin.sh | tail -1)/crane"; export VK_CRANE_BIN; echo "crane: $("$VK_CRANE_BIN" version) (registry conformance client, scripts/cranebin.sh)"
VK_METRICS_SERVER_BIN="$(bash scripts/metricsserverbin.sh | tail -1)/metrics-server"; export VK_METRICS_SERVER_BIN; echo "$(cat "$(dirname "$VK_METRICS_SERVER_BIN")/VERSION") (kubectl top, scripts/metricsserverbin.sh)"
if [ $# -gt 0 ]; then
  exec node ground/run-tests.ts "$@"
fi
echo "== typecheck"; tsc --noEmit -p .
echo "== lint"; biome check --reporter=summary .
exec node ground/run-tests.ts
