//go:build tools

// Package orasbin is never compiled: it only keeps `go mod tidy` from dropping the
// requirement whose main package scripts/orasbin.sh builds (oras, the second independent OCI
// client: it pushes the hand-made v2 snapshot vectors of test/integration/registry-v2.test.ts
// and lists and fetches what we push).
package orasbin

import (
	_ "oras.land/oras/cmd/oras"
)
