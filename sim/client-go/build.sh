#!/usr/bin/env bash
# Builds the simulator's thin `cocoon` client (main.go) and the bench's rusage helper
# (rusage/main.go) into <repo>/node_modules/.cache/vk-cocoon/, once per source hash.
# Called by scripts/setup.sh. Without Go the simulator keeps working through its Node
# fallback (about ten times the CPU per call): a note is printed and nothing fails.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="$repo/node_modules/.cache/vk-cocoon"
go="$(command -v go || true)"
[ -n "$go" ] || go=/usr/local/go/bin/go
if [ ! -x "$go" ]; then
  echo "setup: Go not found: the cocoon simulator runs without its server client (slower calls)" >&2
  exit 0
fi
hash="$(cd "$here" && cat go.mod main.go rusage/main.go build.sh | sha256sum | cut -c1-16)"
if [ -x "$out/cocoon-sim-client" ] && [ -x "$out/cocoon-sim-rusage" ] &&
  [ "$(cat "$out/cocoon-sim-client.hash" 2>/dev/null)" = "$hash" ]; then
  exit 0
fi
echo "setup: building the cocoon simulator's thin client (Go, $("$go" env GOVERSION))" >&2
mkdir -p "$out"
cd "$here"
export CGO_ENABLED=0 GOTOOLCHAIN=local GOPROXY=off GOFLAGS=-trimpath
"$go" build -ldflags='-s -w' -o "$out/cocoon-sim-client.$$" .
"$go" build -ldflags='-s -w' -o "$out/cocoon-sim-rusage.$$" ./rusage
mv -f "$out/cocoon-sim-client.$$" "$out/cocoon-sim-client"
mv -f "$out/cocoon-sim-rusage.$$" "$out/cocoon-sim-rusage"
echo "$hash" >"$out/cocoon-sim-client.hash"
