package template

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/testutil"
)

// groupOf returns the PIDs of the live processes in process group pgid.
func groupOf(t *testing.T, pgid int) []int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp ...; comm may hold spaces, so split after the last ')'.
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		if len(f) > 2 && f[0] != "Z" && f[2] == strconv.Itoa(pgid) {
			out = append(out, pid)
		}
	}
	return out
}

// processWith returns the PID of a process whose command line contains s, or 0.
func processWith(s string) int {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(b), s) {
			return pid
		}
	}
	return 0
}

// leftovers lists what is under a template's directory.
func leftovers(t *testing.T, s *Store, name string) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(s.dir, name))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

// TestCancelledBuildStopsAndLeavesNothing builds a template whose recipe runs a command that
// ignores SIGTERM and has a child of its own; the build is cancelled once it runs.
func TestCancelledBuildStopsAndLeavesNothing(t *testing.T) {
	s, _ := newStore(t, hostBusybox(t))
	marker := "space-cancel-test-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	started := make(chan string, 1)
	s.recipes["slow"] = recipe{
		version: 1,
		inputs:  func(*Store) ([]byte, error) { return nil, nil },
		build: func(ctx context.Context, s *Store, rootfs string) error {
			os.WriteFile(filepath.Join(rootfs, "partial"), []byte("x"), 0o644)
			script := `trap '' TERM; sleep 1000 & echo started; while :; do sleep 0.05; done; : ` + marker
			return runLogged(ctx, "sh", []string{"-c", script}, func(line string) {
				select {
				case started <- line:
				default:
				}
			})
		},
	}
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() { _, err := s.Ensure(ctx, "slow"); errc <- err }()
	select {
	case <-started:
	case err := <-errc:
		t.Fatalf("build ended early: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("recipe did not start")
	}
	pid := processWith(marker)
	if pid == 0 {
		t.Fatal("recipe's process not found")
	}
	group := groupOf(t, pid)
	if len(group) < 2 {
		t.Fatalf("process group %d = %v, want the shell and its sleep", pid, group)
	}
	if b := s.Builds(); len(b) != 1 || b[0].Name != "slow" {
		t.Errorf("Builds() = %+v", b)
	}
	cancel()
	start := time.Now()
	select {
	case err := <-errc:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Ensure = %v, want context.Canceled", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Ensure did not return within 2 s of cancel")
	}
	// The build goroutine removes its temp dir just after: give it the rest of the 2 s.
	for time.Since(start) < 2*time.Second && (len(leftovers(t, s, "slow")) > 0 || len(s.Builds()) > 0 || len(groupOf(t, pid)) > 0) {
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("stopped in %v", time.Since(start).Round(time.Millisecond))
	if l := leftovers(t, s, "slow"); len(l) > 0 {
		t.Errorf("left under the template's directory: %v", l)
	}
	if g := groupOf(t, pid); len(g) > 0 {
		t.Errorf("processes left: %v", g)
		for _, p := range g {
			syscall.Kill(p, syscall.SIGKILL)
		}
	}
	if b := s.Builds(); len(b) != 0 {
		t.Errorf("Builds() after cancel = %+v", b)
	}
}

// TestCancelMmdebstrap runs the real base recipe against a mirror on loopback that accepts
// connections and never answers, and cancels it a second after apt connected.
func TestCancelMmdebstrap(t *testing.T) {
	testutil.RequiresRoot(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	connected := make(chan struct{}, 16)
	go func() {
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
			connected <- struct{}{}
		}
	}()
	aptDir := t.TempDir()
	sources := fmt.Sprintf("deb http://%s/debian bookworm main\n", ln.Addr())
	if err := os.WriteFile(filepath.Join(aptDir, "sources.list"), []byte(sources), 0o644); err != nil {
		t.Fatal(err)
	}
	s, _ := newStore(t, hostBusybox(t))
	s.recipes["base"] = baseRecipeFrom(defaultBaseSpec(), aptDir)
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() { _, err := s.Ensure(ctx, "base"); errc <- err }()
	select {
	case <-connected:
	case err := <-errc:
		t.Fatalf("base build ended before apt connected: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("apt never connected to the mirror")
	}
	time.Sleep(time.Second)
	pid, err := syscall.Getpgid(processWith(filepath.Join(s.dir, "base")))
	if err != nil {
		t.Fatalf("mmdebstrap not found: %v", err)
	}
	group := groupOf(t, pid)
	if b := s.Builds(); len(b) != 1 || b[0].Step != "running apt-get update" {
		t.Errorf("Builds() = %+v, want base at apt-get update", b)
	}
	cancel()
	start := time.Now()
	select {
	case err := <-errc:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Ensure = %v, want context.Canceled", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Ensure did not return within 2 s of cancel")
	}
	for time.Since(start) < 2*time.Second && (len(leftovers(t, s, "base")) > 0 || len(groupOf(t, pid)) > 0) {
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("mmdebstrap (%d processes) stopped in %v", len(group), time.Since(start).Round(time.Millisecond))
	if l := leftovers(t, s, "base"); len(l) > 0 {
		t.Errorf("left under the template's directory: %v", l)
	}
	if g := groupOf(t, pid); len(g) > 0 {
		t.Errorf("processes left: %v", g)
	}
}
