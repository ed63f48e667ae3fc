package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/space-sandbox/space/pkg/client"
)

func TestParseBuild(t *testing.T) {
	f := filepath.Join(t.TempDir(), "x.py")
	if err := os.WriteFile(f, []byte("print(1)\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	got, err := parseBuild([]string{"app", "--from", "minimal", "--run", "mkdir /app", "--env", "A=b=c", "--workdir", "/app", "--copy", f + ":/app/x.py"})
	if err != nil {
		t.Fatal(err)
	}
	want := client.BuildTemplateRequest{Name: "app", From: client.BuildFrom{Template: "minimal"}, Steps: []client.BuildStep{
		{Run: "mkdir /app"}, {Env: map[string]string{"A": "b=c"}}, {Workdir: "/app"},
		{Copy: &client.CopyStep{Path: "/app/x.py", ContentB64: "cHJpbnQoMSkK", Mode: 0o640}},
	}}
	if d := cmp.Diff(want, got); d != "" {
		t.Fatalf("parseBuild (-want +got):\n%s", d)
	}
	for _, bad := range [][]string{
		{"--from", "minimal"}, {"app"}, {"app", "--from", "a", "--image", "b"}, {"app", "--from"},
		{"app", "--from", "m", "--env", "novalue"}, {"app", "--from", "m", "--copy", "x:relative"}, {"app", "b", "--from", "m"},
		{"app", "--from", "m", "--bogus", "1"},
	} {
		if _, err := parseBuild(bad); err == nil {
			t.Errorf("parseBuild(%q) accepted", bad)
		}
	}
}
