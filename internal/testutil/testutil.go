// Package testutil holds helpers shared by SPACE's tests: the single gate for privileged tests
// and a reader of a sandbox's host cgroup on v1 or v2. Only _test.go files import it.
package testutil

import (
	"os"
	"testing"
)

// RequiresRoot skips t unless the test runs as root and SPACE_PRIVILEGED_TESTS=1 (set by
// `make test`). Privileged tests create network namespaces, mounts and sandboxes.
func RequiresRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("privileged test: needs root")
	}
	if os.Getenv("SPACE_PRIVILEGED_TESTS") != "1" {
		t.Skip("privileged test: set SPACE_PRIVILEGED_TESTS=1")
	}
}
