// Package server holds the code-interpreter server that runs inside sandboxes of the
// code-interpreter template (Python, on Debian's jupyter_client and ipykernel), embedded so that
// spaced can write it into the template.
package server

// Placeholder until the server lands: the template recipe builds against this API.

// Port is the port the server listens on inside the sandbox (E2B's).
const Port = 49999

// Dir is where the files are installed in the template.
const Dir = "/opt/space/code-interpreter"

// File is one file of the server, with its path relative to Dir.
type File struct {
	Path string
	Mode uint32
	Data []byte
}

// Files returns the server's files.
func Files() []File { return nil }

// Command is the command line that starts the server.
func Command() []string { return []string{"python3", Dir + "/server.py"} }
