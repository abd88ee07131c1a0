#!/usr/bin/env bash
# Ensures the CNCF distribution v3 registry (github.com/distribution/distribution/v3/cmd/registry),
# the test ground's default OCI registry (ground/registry.ts), is built from the Go module proxy
# and cached (scripts/gotool.sh; wrapper module test/distributionbin). Prints the cache directory
# (holding `registry` and VERSION: module and version) on the last line of stdout. Debian's
# docker-registry (distribution 2.8) stays installed by scripts/setup.sh for what needs its quirks.
set -euo pipefail
# `registry --version` prints its own path first; VERSION keeps what follows it.
dir="$(bash "$(dirname "$0")/gotool.sh" distribution github.com/distribution/distribution/v3 \
  github.com/distribution/distribution/v3/cmd/registry registry --version \
  '-X github.com/distribution/distribution/v3/version.version=${ver}' | tail -1)"
if [ "$(wc -w < "$dir/VERSION")" -gt 2 ]; then
  awk '{print $2, $3}' "$dir/VERSION" > "$dir/VERSION.tmp" && mv "$dir/VERSION.tmp" "$dir/VERSION"
fi
echo "$dir"
