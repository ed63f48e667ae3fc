package main

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestLoadConfig(t *testing.T) {
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		args    []string
		environ []string
		want    config
		bad     bool
	}{
		{
			name:    "defaults; agent variables never reach the base env",
			environ: []string{"PATH=/bin", "SPACE_AGENT_TOKEN=t0k", "SPACE_AGENT_OTHER=x", "HOME=/root"},
			want:    config{addr: defaultAddr, token: "t0k", logLevel: slog.LevelInfo, baseEnv: []string{"PATH=/bin", "HOME=/root"}},
		},
		{
			name:    "token file, env address, flag overrides env",
			args:    []string{"-log-level", "debug"},
			environ: []string{"SPACE_AGENT_TOKEN_FILE=" + tokenFile, "SPACE_AGENT_ADDR=127.0.0.1:1", "SPACE_AGENT_LOG_LEVEL=error"},
			want:    config{addr: "127.0.0.1:1", token: "from-file", logLevel: slog.LevelDebug},
		},
		{
			name:    "token wins over token file",
			args:    []string{"-addr", ":9"},
			environ: []string{"SPACE_AGENT_TOKEN=direct", "SPACE_AGENT_TOKEN_FILE=/nonexistent"},
			want:    config{addr: ":9", token: "direct", logLevel: slog.LevelInfo},
		},
		{name: "missing token file", environ: []string{"SPACE_AGENT_TOKEN_FILE=/nonexistent"}, bad: true},
		{name: "bad level", args: []string{"-log-level", "loud"}, bad: true},
		{name: "unknown flag", args: []string{"-nope"}, bad: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := loadConfig(tc.args, tc.environ)
			if (err != nil) != tc.bad {
				t.Fatalf("err = %v", err)
			}
			if tc.bad {
				return
			}
			if diff := cmp.Diff(tc.want, got, cmp.AllowUnexported(config{})); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestIsMountPoint(t *testing.T) {
	if !isMountPoint("/") {
		t.Error("/ is a mount point")
	}
	sub := filepath.Join(t.TempDir(), "plain")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	if isMountPoint(sub) {
		t.Error("a plain subdirectory detected as mount point")
	}
	if _, err := os.Stat("/proc/self"); err == nil && !isMountPoint("/proc") {
		t.Error("/proc is mounted but not detected")
	}
	if isMountPoint("/nonexistent-dir-xyz") {
		t.Error("missing dir detected as mount point")
	}
}
