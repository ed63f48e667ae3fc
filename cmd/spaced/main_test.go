package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestRunUsage covers what runs before any serving: help, version and mistakes in the command.
func TestRunUsage(t *testing.T) {
	tests := []struct {
		args       []string
		wantCode   int
		wantStdout string // a substring; "" wants none
		wantStderr string // a substring; "" wants none
	}{
		{[]string{"help"}, 0, "usage: spaced COMMAND", ""},
		{[]string{"-h"}, 0, "usage: spaced COMMAND", ""},
		{[]string{"--help"}, 0, "usage: spaced COMMAND", ""},
		{[]string{"version"}, 0, "spaced dev\n", ""},
		{[]string{"--version"}, 0, "spaced dev\n", ""},
		{nil, 2, "", "usage: spaced COMMAND"},
		{[]string{"frobnicate"}, 2, "", `unknown command "frobnicate"`},
		// serve's own flags: help lists them and is not an error; a bad one is.
		{[]string{"serve", "-h"}, 0, "", ""},
		{[]string{"serve", "--bogus"}, 2, "", "flag provided but not defined: -bogus"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(tt.args, &stdout, &stderr)
			if code != tt.wantCode {
				t.Errorf("exit %d, want %d (stderr %q)", code, tt.wantCode, stderr.String())
			}
			for _, c := range []struct {
				name, got, want string
			}{{"stdout", stdout.String(), tt.wantStdout}, {"stderr", stderr.String(), tt.wantStderr}} {
				if (c.want == "") != (c.got == "") || !strings.Contains(c.got, c.want) {
					t.Errorf("%s %q, want %q", c.name, c.got, c.want)
				}
			}
			if strings.Count(stdout.String()+stderr.String(), "usage: spaced") > 1 {
				t.Errorf("usage printed more than once")
			}
		})
	}
}
