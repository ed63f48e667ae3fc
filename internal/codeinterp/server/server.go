// Package server holds the code-interpreter server that runs inside sandboxes of the
// code-interpreter template: a Python program on Debian's jupyter_client, ipykernel and
// tornado that speaks E2B's code-interpreter wire on port 49999 and runs Python (IPython),
// bash and JavaScript (Node) kernels. It is embedded so that spaced can write it into the
// template; test_server.py is its test suite, run inside a real sandbox by the e2e suite.
package server

import (
	"embed"
	"io/fs"
	"path"
	"sort"
	"strings"
)

// Port is the port the server listens on inside the sandbox (E2B's).
const Port = 49999

// Dir is where the files are installed in the template.
const Dir = "/opt/space/code-interpreter"

//go:embed *.py *.js ipython
var files embed.FS

// File is one file of the server, with its path relative to Dir.
type File struct {
	Path string
	Mode uint32
	Data []byte
}

// Files returns the server's files (not its tests), sorted by path.
func Files() []File {
	var out []File
	_ = fs.WalkDir(files, ".", func(p string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() || strings.HasPrefix(path.Base(p), "test_") {
			return err
		}
		b, err := files.ReadFile(p)
		if err != nil {
			return err
		}
		mode := uint32(0o644)
		if p == "server.py" {
			mode = 0o755
		}
		out = append(out, File{Path: p, Mode: mode, Data: b})
		return nil
	})
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out
}

// TestSuite returns test_server.py, the server's own tests.
func TestSuite() []byte {
	b, _ := files.ReadFile("test_server.py")
	return b
}

// Command is the command line that starts the server.
func Command() []string { return []string{"/usr/bin/python3", Dir + "/server.py"} }
