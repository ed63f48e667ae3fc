package server

import (
	"bytes"
	"path"
	"strings"
	"testing"
)

// TestFiles: every module the server imports is embedded, the entry point is what Command runs,
// and nothing of the tests or of Python's caches slipped in.
func TestFiles(t *testing.T) {
	files := Files()
	byPath := map[string]File{}
	for _, f := range files {
		if _, dup := byPath[f.Path]; dup {
			t.Errorf("%s twice", f.Path)
		}
		byPath[f.Path] = f
		if len(f.Data) == 0 {
			t.Errorf("%s is empty", f.Path)
		}
		if strings.HasPrefix(f.Path, "/") || strings.Contains(f.Path, "..") {
			t.Errorf("%s is not a relative path inside the install dir", f.Path)
		}
		if strings.Contains(f.Path, "__pycache__") || strings.HasPrefix(path.Base(f.Path), "test_") || strings.HasSuffix(f.Path, ".go") {
			t.Errorf("%s should not be installed", f.Path)
		}
		if f.Mode&^0o777 != 0 || f.Mode&0o444 != 0o444 {
			t.Errorf("%s: mode %o", f.Path, f.Mode)
		}
	}
	for _, want := range []string{"server.py", "jskernel.js", "ipython/ipython_kernel_config.py", "ipython/startup/00-space.py"} {
		if _, ok := byPath[want]; !ok {
			t.Errorf("%s is not embedded", want)
		}
	}
	// Every local module a Python file imports is there.
	for _, f := range files {
		if !strings.HasSuffix(f.Path, ".py") || strings.HasPrefix(f.Path, "ipython/") {
			continue
		}
		for _, line := range strings.Split(string(f.Data), "\n") {
			fields := strings.Fields(line)
			if len(fields) < 2 || (fields[0] != "import" && fields[0] != "from") {
				continue
			}
			mod := strings.TrimSuffix(fields[1], ",")
			for _, local := range []string{"wire", "kernel", "pykernel", "prockernel", "contexts"} {
				if mod == local {
					if _, ok := byPath[local+".py"]; !ok {
						t.Errorf("%s imports %s, which is not embedded", f.Path, local)
					}
				}
			}
		}
	}

	cmd := Command()
	if len(cmd) != 2 || cmd[0] != "/usr/bin/python3" || cmd[1] != path.Join(InstallDir, "server.py") {
		t.Errorf("Command() = %q", cmd)
	}
	if !bytes.Contains(byPath["server.py"].Data, []byte("default=49999")) || Port != 49999 {
		t.Error("server.py's default port is not Port")
	}

	// Fresh copies each call.
	a, b := Files(), Files()
	a[0].Data[0] ^= 0xff
	if a[0].Data[0] == b[0].Data[0] {
		t.Error("Files() shares its data between calls")
	}
}
