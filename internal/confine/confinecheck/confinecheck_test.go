package confinecheck

import (
	"testing"

	"golang.org/x/tools/go/analysis/analysistest"
)

// TestAnalyzer: a reintroduced os.Open of a layer path (and its relatives) fails the lint; a
// call marked as the host's own, and packages that handle no sandbox trees, do not.
func TestAnalyzer(t *testing.T) {
	analysistest.Run(t, analysistest.TestData(), Analyzer, "example.com/internal/sandbox", "example.com/internal/api")
}
