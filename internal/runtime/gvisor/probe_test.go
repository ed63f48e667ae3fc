package gvisor

import (
	"context"
	"os"
	"os/exec"
	"testing"
)

// TestAliveFollowsTheProcess: Alive answers from /proc for a process runsc reported, and stops
// answering true the moment that process is gone or its PID names another process.
func TestAliveFollowsTheProcess(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	start, ok := procStart(pid)
	if !ok {
		t.Fatalf("procStart(%d) failed", pid)
	}
	if self, ok := procStart(os.Getpid()); !ok || self == "" {
		t.Fatalf("procStart(self) = %q, %v", self, ok)
	}
	d := &Driver{}
	d.alive.Store("sbx", procID{pid: pid, start: start})
	if !d.Alive(context.Background(), "sbx") {
		t.Fatal("Alive false for a running process")
	}
	d.alive.Store("reused", procID{pid: pid, start: start + "0"})
	if d.Alive(context.Background(), "reused") {
		t.Error("Alive true for a PID whose process started at another time")
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err == nil {
		t.Fatal("sleep exited cleanly after SIGKILL")
	}
	if _, ok := procStart(pid); ok {
		t.Fatalf("procStart(%d) still answers after the process was reaped", pid)
	}
	d.alive.Store("sbx", procID{pid: pid, start: start})
	if d.Alive(context.Background(), "sbx") {
		t.Error("Alive true for an exited process")
	}
	if _, ok := d.alive.Load("sbx"); ok {
		t.Error("a dead process stays cached")
	}
}
