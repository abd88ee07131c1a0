//go:build tools

// Package distributionbin is never compiled: it only keeps `go mod tidy` from dropping the
// requirement whose main package scripts/distributionbin.sh builds (the CNCF distribution v3
// registry, the default OCI registry of the test ground, ground/registry.ts).
package distributionbin

import (
	_ "github.com/distribution/distribution/v3/cmd/registry"
)
