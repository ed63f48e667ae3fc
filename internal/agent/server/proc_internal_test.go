package server

import (
	"io"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	pb "github.com/space-sandbox/space/internal/agentpb/process"
)

func TestBuildEnv(t *testing.T) {
	u := User{Name: "user", Home: "/home/user"}
	tests := []struct {
		name string
		base []string
		req  map[string]string
		pty  bool
		want []string
	}{
		{
			name: "defaults",
			want: []string{"HOME=/home/user", "USER=user", "LOGNAME=user", "PATH=" + DefaultPath},
		},
		{
			name: "base kept, identity overridden, request wins",
			base: []string{"PATH=/bin", "HOME=/root", "LANG=C.UTF-8", "bogus"},
			req:  map[string]string{"LANG": "de_DE.UTF-8", "Z": "1", "A": "2", "BAD=KEY": "x"},
			want: []string{"PATH=/bin", "HOME=/home/user", "LANG=de_DE.UTF-8", "USER=user", "LOGNAME=user", "A=2", "Z=1"},
		},
		{
			name: "pty gets TERM",
			pty:  true,
			want: []string{"HOME=/home/user", "USER=user", "LOGNAME=user", "PATH=" + DefaultPath, "TERM=xterm-256color"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, buildEnv(tc.base, u, tc.req, tc.pty)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestLookPath(t *testing.T) {
	dir := t.TempDir()
	exe := dir + "/tool"
	if err := os.WriteFile(exe, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dir+"/data", []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, path, want string
		bad              bool
	}{
		{"tool", "/nonexistent:" + dir, exe, false},
		{"data", dir, "", true}, // not executable
		{"./rel", "", "./rel", false},
		{"tool", "", "", true},
	}
	for _, tc := range tests {
		got, err := lookPath(tc.name, tc.path, "/")
		if got != tc.want || (err != nil) != tc.bad {
			t.Errorf("lookPath(%q, %q) = %q, %v", tc.name, tc.path, got, err)
		}
	}
}

// Finished processes are forgotten beyond MaxProcesses, newest kept.
func TestProcTablePrune(t *testing.T) {
	cfg := Config{MaxProcesses: 2, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	cfg.setDefaults()
	tbl := newProcTable(&cfg)
	r := startReaper(tbl, false, cfg.Logger)
	defer r.stop()
	var pids []int
	for range 4 {
		p, rd, err := tbl.start(procSpec{path: "/bin/true", argv: []string{"true"}, dir: "/", config: &pb.ProcessConfig{Cmd: "true"}})
		if err != nil {
			t.Fatal(err)
		}
		rd.release()
		select {
		case <-p.done:
		case <-time.After(5 * time.Second):
			t.Fatal("process did not finish")
		}
		pids = append(pids, p.pid)
		time.Sleep(5 * time.Millisecond)
	}
	tbl.prune()
	var got []int
	for _, p := range tbl.list() {
		got = append(got, p.pid)
	}
	if diff := cmp.Diff(pids[2:], got); diff != "" {
		t.Fatalf("kept (-want +got):\n%s", diff)
	}
}
