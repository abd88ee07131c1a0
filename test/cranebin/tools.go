//go:build tools

// Package cranebin is never compiled: it only keeps `go mod tidy` from dropping the
// requirement whose main package scripts/cranebin.sh builds (crane, the conformance
// client of test/integration/registry-push.test.ts and bench/transfer.ts).
package cranebin

import (
	_ "github.com/google/go-containerregistry/cmd/crane"
)
