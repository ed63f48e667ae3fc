package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestE2BSDK drives spaced with the unmodified E2B SDK (npm "e2b", pinned at 2.51.0 and 2.50.0,
// which use different create and connect routes; e2e/e2b holds the package-lock, installed by
// `npm ci`): create, commands, files, info, list, timeout, pause, connect, kill.
func TestE2BSDK(t *testing.T) {
	dir, err := filepath.Abs("e2b")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "e2b-2.51.0")); err != nil {
		t.Fatalf("the E2B SDK is not installed: run `npm ci` in e2e/e2b (.ci/run does): %v", err)
	}
	d := startSpaced(t)
	for _, version := range []string{"2.51.0", "2.50.0"} {
		t.Run(version, func(t *testing.T) {
			cmd := exec.Command("node", "test.mjs", version)
			cmd.Dir = dir
			cmd.Env = append(os.Environ(), "E2B_API_KEY="+d.Opts.Key, "E2B_API_URL="+d.URL, "E2B_SANDBOX_URL="+d.URL)
			out, err := cmd.CombinedOutput()
			t.Logf("e2b %s:\n%s", version, out)
			if err != nil || strings.Contains(string(out), "FAIL") {
				t.Fatalf("the E2B SDK %s failed against spaced: %v", version, err)
			}
		})
	}
}
