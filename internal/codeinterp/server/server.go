// Package server holds the code-interpreter server that runs inside sandboxes: the Python 3
// (tornado + jupyter_client) program, its node harness and its IPython profile that answer the
// wire of the unmodified @e2b/code-interpreter SDK on port 49999. The files are embedded so
// spaced can write them into the code-interpreter template; nothing here runs on the host.
// Only the template build (spaced's code-interpreter template) should import it; it imports
// nothing of SPACE.
//
// In the sandbox the server runs as the unprivileged user (HOME=/home/user) with Debian
// bookworm's python3-tornado, python3-jupyter-client, python3-ipykernel, python3-matplotlib,
// python3-pandas and nodejs (18). See README.md beside this file for its API, flags and tests.
package server

import (
	"embed"
	"io/fs"
	"path"
	"sort"
)

// Port is the code server's port in the sandbox, as the SDK expects it.
const Port = 49999

// InstallDir is where the template puts Files.
const InstallDir = "/opt/space/code-interpreter"

// File is one file of the server: Path is relative to InstallDir, Mode its permission bits.
type File struct {
	Path string
	Mode uint32
	Data []byte
}

// The server's files. The unittest suite (test_server.py) is not among them: the e2e suite
// runs it (TestSuite) inside a sandbox against the installed copy.
//
//go:embed server.py wire.py kernel.py pykernel.py prockernel.py contexts.py jskernel.js
//go:embed ipython/ipython_kernel_config.py ipython/startup/00-space.py
var assets embed.FS

//go:embed test_server.py
var testSuite []byte

// TestSuite returns test_server.py, the server's black-box unittest suite.
func TestSuite() []byte { return append([]byte(nil), testSuite...) }

// Files returns every file of the server, sorted by path, ready to be written under InstallDir.
// Each call returns fresh slices; callers may modify them.
func Files() []File {
	var files []File
	err := fs.WalkDir(assets, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := assets.ReadFile(p)
		if err != nil {
			return err
		}
		mode := uint32(0o644)
		if p == "server.py" {
			mode = 0o755
		}
		files = append(files, File{Path: p, Mode: mode, Data: data})
		return nil
	})
	if err != nil {
		panic("codeinterp/server: reading embedded files: " + err.Error()) // the build embedded them
	}
	sort.Slice(files, func(i, j int) bool { return files[i].Path < files[j].Path })
	return files
}

// Command is the exact command line that starts the server in the sandbox (as the sandbox's
// user, with HOME set; it listens on 0.0.0.0:Port and is ready once GET /health answers 200).
func Command() []string {
	return []string{"/usr/bin/python3", path.Join(InstallDir, "server.py")}
}
