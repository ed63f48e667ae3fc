package e2e

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/space-sandbox/space/pkg/client"
)

// TestNonUTF8Names: a directory holding names that are not UTF-8 lists (the invalid bytes as
// U+FFFD), a path that is not UTF-8 or is too long is a 400 with a JSON error, and the sandbox
// runs on.
func TestNonUTF8Names(t *testing.T) {
	d := startSpaced(t, "SPACE_WARM_POOL=0")
	c := d.Client
	id := create(t, c, client.CreateSandboxRequest{Template: "minimal"}).ID
	if r := run(t, c, id, `mkdir /root/d && cd /root/d && touch ok "$(printf 'a\377b')" "$(printf '\303')" && ln -s "$(printf 'x\376')" link && ls | wc -l`); strings.TrimSpace(r.Stdout) != "4" {
		t.Fatalf("setup: %+v", r)
	}
	es, err := c.ListDir(ctxT(t), id, "/root/d")
	if err != nil {
		t.Fatalf("list a directory with non-UTF-8 names: %v", err)
	}
	var names []string
	for _, e := range es {
		names = append(names, e.Name)
	}
	slices.Sort(names)
	if want := []string{"a\uFFFDb", "link", "ok", "\uFFFD"}; !slices.Equal(names, want) {
		t.Errorf("names %q, want %q", names, want)
	}
	for _, p := range []string{"/root/d/a\xffb", "/root/\xc3", "/" + strings.Repeat("x", 4096)} {
		_, err := c.Download(ctxT(t), id, p)
		var apiErr *client.Error
		if !errors.As(err, &apiErr) || apiErr.Status != 400 || apiErr.Code != "invalid_argument" {
			t.Errorf("download %.40q: %v, want 400 invalid_argument", p, err)
		}
		if _, err := c.ListDir(ctxT(t), id, p); !errors.As(err, &apiErr) || apiErr.Status != 400 {
			t.Errorf("list %.40q: %v, want 400", p, err)
		}
	}
	if got, err := c.GetSandbox(ctxT(t), id); err != nil || got.State != client.StateRunning {
		t.Fatalf("sandbox after: %+v, %v", got, err)
	}
}
