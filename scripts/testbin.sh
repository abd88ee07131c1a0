#!/usr/bin/env bash
# Ensures kube-apiserver, kube-controller-manager, kube-scheduler, etcd and kubectl built from the Go module proxy
# (test-ground.md §3) are cached outside the repository, keyed by Kubernetes version and
# the wrapper module's go.sum. Prints the cache directory on the last line of stdout.
# Progress goes to stderr. Builds into a temporary sibling and renames it into place,
# so a killed build never leaves a half-filled cache.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
mod="$root/test/k8sbin"
ver="$(sed -n 's/^\s*k8s.io\/kubernetes \(v[0-9.]*\).*/\1/p' "$mod/go.mod" | head -1)"
[ -n "$ver" ] || { echo "testbin: cannot read the Kubernetes version from $mod/go.mod" >&2; exit 1; }
sum="$(sha256sum "$mod/go.sum" | cut -c1-12)"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/vk-cocoon/testbin/k8s-${ver}-${sum}"
bins="etcd kube-apiserver kube-controller-manager kube-scheduler kubectl"
have=1; for b in $bins; do [ -x "$cache/$b" ] || have=0; done
if [ "$have" = 1 ] && [ -f "$cache/VERSION" ]; then
  echo "testbin: cached $(cat "$cache/VERSION" | tr '\n' ' ')" >&2
  echo "$cache"; exit 0
fi
command -v go >/dev/null || { echo "testbin: Go 1.26+ is required to build the test control plane (no 'go' on PATH)" >&2; exit 1; }
minor="${ver#v1.}"; minor="${minor%%.*}"
rm -rf "$(dirname "$cache")"/.build-* 2>/dev/null || true
tmp="$(mktemp -d "$(dirname "$cache")/.build-XXXXXX" 2>/dev/null || { mkdir -p "$(dirname "$cache")"; mktemp -d "$(dirname "$cache")/.build-XXXXXX"; })"
trap 'rm -rf "$tmp"' EXIT
cd "$mod"
export CGO_ENABLED=0 GOFLAGS="${GOFLAGS:-} -mod=mod"
start=$SECONDS
step() { echo "testbin: [$((SECONDS - start))s] $*" >&2; }
step "building Kubernetes ${ver} test binaries into $cache (cold build: 10-25 min on 2 cores)"
step "downloading modules"
go mod download -x 2>&1 | awk '/^# get/ {n++; if (n % 50 == 0) {printf "testbin:   %d modules fetched\n", n > "/dev/stderr"}}' || true
ldk="-s -w -X k8s.io/component-base/version.gitVersion=${ver} -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=${minor}"
( while sleep 30; do step "  still compiling ($(ls "$tmp" | tr '\n' ' '))"; done ) & ticker=$!
trap 'kill $ticker 2>/dev/null; rm -rf "$tmp"' EXIT
step "compiling etcd"
go build -trimpath -ldflags "-s -w" -o "$tmp/etcd" go.etcd.io/etcd/server/v3
step "compiling kube-apiserver"
go build -trimpath -ldflags "$ldk" -o "$tmp/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver
for b in kube-controller-manager kube-scheduler kubectl; do
  step "compiling $b"
  go build -trimpath -ldflags "$ldk" -o "$tmp/$b" "k8s.io/kubernetes/cmd/$b"
done
kill $ticker 2>/dev/null || true
{
  "$tmp/kube-apiserver" --version
  echo "etcd $("$tmp/etcd" --version | sed -n 's/^etcd Version: //p')"
  "$tmp/kubectl" version --client 2>/dev/null | sed -n 1p
} > "$tmp/VERSION"
rm -rf "$cache"; mv "$tmp" "$cache"; trap - EXIT
step "done: $(tr '\n' ' ' < "$cache/VERSION")"
echo "$cache"
