package api

import "testing"

// RegisteredRoutes returns every "METHOD /path" pattern the native API (routes()) and the E2B
// control plane (internal/e2b) register, read from their sources as TestOpenAPIRoutes reads
// them, so that tests outside the package can walk the route table.
func RegisteredRoutes(t *testing.T) (native, e2b []string) {
	t.Helper()
	for _, r := range oaRegisteredRoutesIn(t, ".", oaCatchAll) {
		native = append(native, r.String())
	}
	for _, r := range oaRegisteredRoutesIn(t, "../e2b", []string{"/"}) {
		e2b = append(e2b, r.String())
	}
	return native, e2b
}
