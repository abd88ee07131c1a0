#!/usr/bin/env bash
# Regenerates go.mod/go.sum of the wrapper module for a Kubernetes version
# (test-ground.md §3.4): require k8s.io/kubernetes@<v>, replace every staging module
# by its published tag v0.<minor>.<patch>, copy the godebug line, go mod tidy.
# Usage: test/k8sbin/regen.sh v1.36.3
set -euo pipefail
ver="${1:?usage: regen.sh v1.Y.Z}"
cd "$(dirname "$0")"
stag="v0.${ver#v1.}"
gomod=$(go mod download -json "k8s.io/kubernetes@${ver}" | sed -n 's/^\s*"GoMod": "\(.*\)",$/\1/p')
[ -f "$gomod" ] || { echo "regen: cannot locate go.mod of k8s.io/kubernetes@${ver}" >&2; exit 1; }
godebug=$(grep -E '^godebug ' "$gomod" || true)
cat > go.mod <<MOD
module vkcocoon.test/k8sbin

go 1.26

${godebug}

require k8s.io/kubernetes ${ver}
MOD
for name in $(sed -n 's#^\s*k8s.io/\([^ ]*\) => ./staging/src/k8s.io/.*#\1#p' "$gomod"); do
  go mod edit -replace="k8s.io/${name}=k8s.io/${name}@${stag}"
done
rm -f go.sum
go mod tidy
echo "regen: k8s.io/kubernetes ${ver}, $(grep -c '=> k8s.io/' go.mod) staging replaces"
