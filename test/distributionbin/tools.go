//go:build tools

// Package distributionbin is never compiled: it only keeps `go mod tidy` from dropping the
// requirement whose main package scripts/distributionbin.sh builds (the CNCF distribution v3
// registry, the test ground's registry of kind `distribution`, ground/registry.ts).
package distributionbin

import (
	_ "github.com/distribution/distribution/v3/cmd/registry"
)
