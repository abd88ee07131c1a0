#!/usr/bin/env bash
# Ensures `crane` (github.com/google/go-containerregistry/cmd/crane), the independent OCI
# client that the registry conformance test (test/integration/registry-push.test.ts) and
# bench/transfer.ts check our pushes with, is built from the Go module proxy and cached
# (scripts/gotool.sh; wrapper module test/cranebin). Prints the cache directory (holding
# `crane`) on the last line of stdout.
set -euo pipefail
exec bash "$(dirname "$0")/gotool.sh" crane github.com/google/go-containerregistry \
  github.com/google/go-containerregistry/cmd/crane crane version
