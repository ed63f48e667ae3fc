// Command space-lint runs SPACE's own lint passes (internal/confine/confinecheck) over packages,
// as `make lint` does: `space-lint ./...`.
package main

import (
	"golang.org/x/tools/go/analysis/singlechecker"

	"github.com/space-sandbox/space/internal/confine/confinecheck"
)

func main() { singlechecker.Main(confinecheck.Analyzer) }
