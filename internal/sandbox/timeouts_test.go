package sandbox

import (
	"context"
	"testing"
	"time"
)

// TestTimeoutStartsWhenSandboxDoes: a create that waits for its template to be built (here the
// clock moves ten minutes on while it waits) still gets its whole timeout from the moment the
// sandbox starts, not from the request.
func TestTimeoutStartsWhenSandboxDoes(t *testing.T) {
	var e *testEnv
	e = newTestEnv(t, func(c *Config) {
		inner := c.Templates
		c.Templates = func(ctx context.Context, name string) (Template, error) {
			e.advance(10 * time.Minute) // a first build of the template
			return inner(ctx, name)
		}
	})
	timeout := 300
	info, err := e.m.Create(context.Background(), "t", CreateRequest{Template: "minimal", TimeoutSeconds: &timeout})
	if err != nil {
		t.Fatal(err)
	}
	left := info.ExpiresAt.Sub(e.now())
	if left < 290*time.Second || left > 300*time.Second {
		t.Fatalf("a sandbox whose template took 10 minutes expires in %s; want its whole 300 s", left)
	}
	if err := e.m.Delete(context.Background(), "t", info.ID); err != nil {
		t.Fatal(err)
	}
}
