#!/usr/bin/env bash
# Ensures `oras` (oras.land/oras/cmd/oras), an OCI client nobody here wrote: it pushes the
# hand-made v2 snapshot vectors our daemon clones from and lists and fetches what we push
# (test/integration/registry-v2.test.ts). Built from the Go module proxy and cached
# (scripts/gotool.sh; wrapper module test/orasbin). Prints the cache directory (holding `oras`)
# on the last line of stdout.
set -euo pipefail
exec bash "$(dirname "$0")/gotool.sh" oras oras.land/oras oras.land/oras/cmd/oras oras version
