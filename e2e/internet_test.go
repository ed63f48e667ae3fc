package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/space-sandbox/space/internal/spacedtest"
	"github.com/space-sandbox/space/pkg/client"
)

// The egress tests' addresses in "the internet" (spacedtest.Internet).
const (
	inetAllowed = spacedtest.InetAllowed
	inetDenied  = spacedtest.InetDenied
	spacedAddr  = spacedtest.SpacedAddr
	metadataIP  = spacedtest.MetadataIP
)

// newInternet builds "the internet" for one test and removes it at the end.
func newInternet(t *testing.T) *spacedtest.Internet {
	t.Helper()
	in, err := spacedtest.NewInternet()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(in.Close)
	return in
}

func nsPath(name string) string { return spacedtest.NSPath(name) }

// startSpacedIn starts spaced in the internet test's namespace for spaced, pointed at the
// internet's resolver, and checks at the end that it left nothing behind there.
func startSpacedIn(t *testing.T, in *spacedtest.Internet, env ...string) *spacedtest.Daemon {
	t.Helper()
	bin := binDir(t)
	home := t.TempDir()
	// The gateway verifies the internet's servers against the internet's CA.
	caFile := filepath.Join(t.TempDir(), "internet-ca.pem")
	if err := os.WriteFile(caFile, in.CAPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	env = append([]string{"SPACE_TEMPLATES_DIR=" + sharedTemplates(), "SPACE_EGRESS_DNS=" + spacedtest.InetDNS + ":53",
		"SPACE_EGRESS_CA=" + caFile, "SPACE_WARM_POOL=0"}, env...)
	d, err := spacedtest.Start(context.Background(), spacedtest.Options{Bin: bin, Home: home, Env: env, Netns: nsPath(in.HostNS)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		if list, err := d.Client.ListSandboxes(ctx, client.ListSandboxesOptions{}); err == nil {
			for _, sb := range list {
				if err := d.Client.DeleteSandbox(ctx, sb.ID); err != nil {
					t.Errorf("cleanup: delete %s: %v", sb.ID, err)
				}
			}
		}
		if err := d.Stop(); err != nil {
			t.Errorf("stop spaced: %v", err)
		}
		var leaks []string
		spacedtest.InNetns(nsPath(in.HostNS), func() error {
			leaks = spacedtest.Leaks(d.Opts.Instance, home)
			return nil
		})
		if len(leaks) > 0 {
			t.Errorf("instance %s left behind:\n  %s", d.Opts.Instance, strings.Join(leaks, "\n  "))
		}
		if t.Failed() {
			t.Logf("spaced log:\n%s", tail(d.Log(), 80))
		}
	})
	return d
}
