#!/usr/bin/env bash
# Ensures `crane` (github.com/google/go-containerregistry/cmd/crane), the independent OCI
# client that the registry conformance test (test/integration/registry-push.test.ts) and
# bench/transfer.ts check our pushes with, is built from the Go module proxy and cached
# outside the repository, keyed by its version and the wrapper module's go.sum
# (test/cranebin). Prints the cache directory (holding `crane`) on the last line of stdout;
# progress goes to stderr. Builds into a temporary sibling and renames it into place, so a
# killed build never leaves a half-filled cache. The Kubernetes binaries (scripts/testbin.sh)
# have their own module and cache key; this script never touches them.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
mod="$root/test/cranebin"
ver="$(sed -n 's/^\s*require github.com\/google\/go-containerregistry \(v[0-9.]*\).*/\1/p' "$mod/go.mod" | head -1)"
[ -n "$ver" ] || { echo "cranebin: cannot read the go-containerregistry version from $mod/go.mod" >&2; exit 1; }
sum="$(sha256sum "$mod/go.sum" | cut -c1-12)"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/vk-cocoon/testbin/crane-${ver}-${sum}"
if [ -x "$cache/crane" ]; then
  echo "cranebin: cached crane ${ver}" >&2
  echo "$cache"; exit 0
fi
command -v go >/dev/null || { echo "cranebin: Go is required to build crane (no 'go' on PATH)" >&2; exit 1; }
parent="$(dirname "$cache")"
mkdir -p "$parent"
rm -rf "$parent"/.crane-build-* 2>/dev/null || true
tmp="$(mktemp -d "$parent/.crane-build-XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
cd "$mod"
export CGO_ENABLED=0 GOFLAGS="${GOFLAGS:-} -mod=mod"
start=$SECONDS
echo "cranebin: building crane ${ver} into $cache (cold build: about a minute)" >&2
go build -trimpath -ldflags "-s -w" -o "$tmp/crane" github.com/google/go-containerregistry/cmd/crane
"$tmp/crane" version > "$tmp/VERSION" 2>/dev/null || echo "$ver" > "$tmp/VERSION"
rm -rf "$cache"; mv "$tmp" "$cache"; trap - EXIT
echo "cranebin: [$((SECONDS - start))s] done: crane $(cat "$cache/VERSION")" >&2
echo "$cache"
