#!/usr/bin/env bash
# Ensures `metrics-server` (sigs.k8s.io/metrics-server/cmd/metrics-server), the real aggregated
# metrics API that `kubectl top` goes through in test/integration/top.test.ts
# (ground/metrics-server.ts), is built from the Go module proxy and cached outside the
# repository, keyed by its version and the wrapper module's go.sum (test/metricsserverbin, a
# module with `tool sigs.k8s.io/metrics-server/cmd/metrics-server`). Prints the cache directory
# (holding `metrics-server`) on the last line of stdout; progress goes to stderr. Builds into a
# temporary sibling and renames it into place, so a killed build never leaves a half-filled
# cache. The Kubernetes binaries (scripts/testbin.sh) and crane (scripts/cranebin.sh) have
# their own modules and cache keys; this script never touches them.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
mod="$root/test/metricsserverbin"
ver="$(sed -n 's/^\s*sigs.k8s.io\/metrics-server \(v[0-9.]*\).*/\1/p' "$mod/go.mod" | head -1)"
[ -n "$ver" ] || { echo "metricsserverbin: cannot read the metrics-server version from $mod/go.mod" >&2; exit 1; }
sum="$(sha256sum "$mod/go.sum" | cut -c1-12)"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/vk-cocoon/testbin/metrics-server-${ver}-${sum}"
if [ -x "$cache/metrics-server" ] && [ -f "$cache/VERSION" ]; then
  echo "metricsserverbin: cached metrics-server ${ver}" >&2
  echo "$cache"; exit 0
fi
command -v go >/dev/null || { echo "metricsserverbin: Go is required to build metrics-server (no 'go' on PATH)" >&2; exit 1; }
parent="$(dirname "$cache")"
mkdir -p "$parent"
rm -rf "$parent"/.metrics-server-build-* 2>/dev/null || true
tmp="$(mktemp -d "$parent/.metrics-server-build-XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
cd "$mod"
export CGO_ENABLED=0 GOFLAGS="${GOFLAGS:-} -mod=mod"
start=$SECONDS
step() { echo "metricsserverbin: [$((SECONDS - start))s] $*" >&2; }
step "building metrics-server ${ver} into $cache (cold build: 5-10 min on 2 cores)"
step "downloading modules"
go mod download -x 2>&1 | awk '/^# get/ {n++; if (n % 50 == 0) {printf "metricsserverbin:   %d modules fetched\n", n > "/dev/stderr"}}' || true
( while sleep 30; do step "  still compiling"; done ) & ticker=$!
trap 'kill $ticker 2>/dev/null; rm -rf "$tmp"' EXIT
step "compiling metrics-server"
# The version variables are the ones metrics-server's Makefile sets (client-go's version package).
go build -trimpath -ldflags "-s -w -X k8s.io/client-go/pkg/version.gitVersion=${ver}" \
  -o "$tmp/metrics-server" sigs.k8s.io/metrics-server/cmd/metrics-server
kill $ticker 2>/dev/null || true
echo "metrics-server ${ver}" > "$tmp/VERSION"
rm -rf "$cache"; mv "$tmp" "$cache"; trap - EXIT
step "done: metrics-server ${ver}"
echo "$cache"
