#!/usr/bin/env bash
# Ensures the CNCF distribution v3 registry (github.com/distribution/distribution/v3/cmd/registry),
# the test ground's default OCI registry (ground/registry.ts), is built from the Go module proxy
# and cached outside the repository, keyed by its version and the wrapper module's go.sum
# (test/distributionbin). Prints the cache directory (holding `registry`) on the last line of
# stdout; progress goes to stderr. Builds into a temporary sibling and renames it into place, so
# a killed build never leaves a half-filled cache. Debian's docker-registry (distribution 2.8)
# stays installed by scripts/setup.sh for what needs its quirks.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
mod="$root/test/distributionbin"
ver="$(sed -n 's/^\s*require github.com\/distribution\/distribution\/v3 \(v[0-9.]*\).*/\1/p' "$mod/go.mod" | head -1)"
[ -n "$ver" ] || { echo "distributionbin: cannot read the distribution version from $mod/go.mod" >&2; exit 1; }
sum="$(sha256sum "$mod/go.sum" | cut -c1-12)"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/vk-cocoon/testbin/distribution-${ver}-${sum}"
if [ -x "$cache/registry" ]; then
  echo "distributionbin: cached registry ${ver}" >&2
  echo "$cache"; exit 0
fi
command -v go >/dev/null || { echo "distributionbin: Go is required to build the registry (no 'go' on PATH)" >&2; exit 1; }
parent="$(dirname "$cache")"
mkdir -p "$parent"
rm -rf "$parent"/.distribution-build-* 2>/dev/null || true
tmp="$(mktemp -d "$parent/.distribution-build-XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
cd "$mod"
export CGO_ENABLED=0 GOFLAGS="${GOFLAGS:-} -mod=mod"
start=$SECONDS
echo "distributionbin: building registry ${ver} into $cache (cold build: a minute or two)" >&2
go build -trimpath -ldflags "-s -w -X github.com/distribution/distribution/v3/version.version=${ver}" \
  -o "$tmp/registry" github.com/distribution/distribution/v3/cmd/registry
# `registry --version` prints its own path first: keep the module and version only.
"$tmp/registry" --version 2>/dev/null | awk '{print $2, $3}' > "$tmp/VERSION" || true
[ -s "$tmp/VERSION" ] || echo "$ver" > "$tmp/VERSION"
rm -rf "$cache"; mv "$tmp" "$cache"; trap - EXIT
echo "distributionbin: [$((SECONDS - start))s] done: $(cat "$cache/VERSION")" >&2
echo "$cache"
