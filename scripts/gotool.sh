#!/usr/bin/env bash
# Builds a Go command from the Go module proxy and caches it outside the repository, keyed by
# its version and its wrapper module's go.sum (test/<tool>bin/: a go.mod pinning the module, a
# tools.go keeping `go mod tidy` from dropping it). Prints the cache directory (holding the
# binary and VERSION) on the last line of stdout; progress goes to stderr. Builds into a
# temporary sibling and renames it into place, so a killed build never leaves a half-filled
# cache. scripts/cranebin.sh, distributionbin.sh and orasbin.sh are its callers.
#
#   bash scripts/gotool.sh <tool> <module> <package> <binary> [<version command> [<extra ldflags>]]
#
# <tool> names the wrapper module (test/<tool>bin) and the cache (<tool>-<version>-<hash>);
# <module> is the required module whose version keys the cache; <package> the main package;
# <version command> the binary's arguments that print its version (VERSION holds their output,
# else the module version); <extra ldflags> may use ${ver}.
set -euo pipefail
tool="$1" module="$2" pkg="$3" bin="$4" vercmd="${5:-}" ldextra="${6:-}"
root="$(cd "$(dirname "$0")/.." && pwd)"
mod="$root/test/${tool}bin"
ver="$(awk -v m="$module" '($1 == "require" && $2 == m) || $1 == m { print ($1 == "require" ? $3 : $2); exit }' "$mod/go.mod")"
[ -n "$ver" ] || { echo "${tool}bin: cannot read the version of $module from $mod/go.mod" >&2; exit 1; }
sum="$(sha256sum "$mod/go.sum" | cut -c1-12)"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/vk-cocoon/testbin/${tool}-${ver}-${sum}"
if [ -x "$cache/$bin" ]; then
  echo "${tool}bin: cached $bin ${ver}" >&2
  echo "$cache"; exit 0
fi
command -v go >/dev/null || { echo "${tool}bin: Go is required to build $bin (no 'go' on PATH)" >&2; exit 1; }
parent="$(dirname "$cache")"
mkdir -p "$parent"
rm -rf "$parent"/."${tool}"-build-* 2>/dev/null || true
tmp="$(mktemp -d "$parent/.${tool}-build-XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
cd "$mod"
export CGO_ENABLED=0 GOFLAGS="${GOFLAGS:-} -mod=mod"
start=$SECONDS
echo "${tool}bin: building $bin ${ver} into $cache (a cold build takes a minute or more)" >&2
go build -trimpath -ldflags "-s -w ${ldextra//\$\{ver\}/$ver}" -o "$tmp/$bin" "$pkg"
if [ -n "$vercmd" ]; then
  # shellcheck disable=SC2086 # the version command's words
  "$tmp/$bin" $vercmd > "$tmp/VERSION" 2>/dev/null || true
fi
[ -s "$tmp/VERSION" ] || echo "$ver" > "$tmp/VERSION"
rm -rf "$cache"; mv "$tmp" "$cache"; trap - EXIT
echo "${tool}bin: [$((SECONDS - start))s] done: $bin $(head -1 "$cache/VERSION")" >&2
echo "$cache"
