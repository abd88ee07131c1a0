#!/usr/bin/env bash
# Builds the release artifact: dist/vk-cocoon-<version>-linux-x64.tar.gz, a self-contained tree
# (the Node.js 24 runtime, the daemon with its types stripped, its run-time packages, the
# launcher, the systemd unit, the environment file example, example manifests, docs) that runs
# on a host without a checkout, npm or a system Node.js. The version and the commit are baked
# in (`bin/vk-cocoon --version` prints both). What goes in and why: packaging/build.ts and
# docs/decisions.md "Release artifact"; installing it: docs/operations.md.
#
#   bash scripts/release.sh [--out DIR] [--force]
#
# Progress on stderr; the artifact's path on stdout. An artifact whose inputs (sources, lock
# file, packaging, docs, Node binary, commit) are unchanged is reused, not rebuilt (--force
# rebuilds). Builds into the same DIR wait for each other (a lock file in DIR).
# VK_RELEASE_GZIP_LEVEL (default 6) trades size for build time.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
node="$root/node_modules/.bin/node"
if [ ! -x "$node" ] || ! "$node" --version 2>/dev/null | grep -q '^v24\.'; then
  echo "release: $node is not Node.js 24: run 'npm run setup' first" >&2
  exit 1
fi
out="$root/dist"
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  if [ "${args[i]}" = --out ] && [ $((i + 1)) -lt ${#args[@]} ]; then out="${args[i + 1]}"; fi
done
mkdir -p "$out"
exec 9>"$out/.release.lock"
if ! flock -n 9; then
  echo "release: waiting for another build into $out" >&2
  flock 9
fi
"$node" --disable-warning=ExperimentalWarning "$root/packaging/build.ts" "$@"
