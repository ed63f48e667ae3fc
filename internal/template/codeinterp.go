package template

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"path"
	"strings"
	"time"

	"github.com/space-sandbox/space/internal/codeinterp/server"
	"github.com/space-sandbox/space/internal/confine"
)

// codeInterpreter is the built-in template whose sandboxes run the code-interpreter server
// (internal/codeinterp/server) from their start: base (which has Debian's ipykernel and
// jupyter_client) with one layer holding the server. Its commands run as user in /home/user, as
// E2B's code-interpreter template does.
const codeInterpreter = "code-interpreter"

// codeInterpreterVersion changes whenever the recipe writes a different layer from the same
// server files.
const codeInterpreterVersion = 1

func codeInterpreterRecipe() recipe {
	return codeInterpreterRecipeFrom(server.Files())
}

func codeInterpreterRecipeFrom(files []server.File) recipe {
	return recipe{
		version: codeInterpreterVersion,
		parent:  "base",
		inputs: func(*Store) ([]byte, error) {
			h := sha256.New()
			for _, f := range files {
				fmt.Fprintf(h, "%s %o %d\x00", f.Path, f.Mode, len(f.Data))
				h.Write(f.Data)
			}
			return []byte("server sha256 " + hex.EncodeToString(h.Sum(nil))), nil
		},
		build: func(ctx context.Context, s *Store, layer string) error {
			return writeServerLayer(layer, files)
		},
		user:       "user",
		workingDir: userHome,
		env:        map[string]string{"HOME": userHome},
		start: &Start{
			Command:    server.Command(),
			User:       "user",
			WorkingDir: userHome,
			ReadyPort:  server.Port,
			ReadyPath:  "/health",
		},
	}
}

// writeServerLayer writes the server's files under server.InstallDir in layer, a directory of this
// build (through confine all the same).
func writeServerLayer(layer string, files []server.File) error {
	root, err := confine.Open(layer)
	if err != nil {
		return err
	}
	defer root.Close()
	now := time.Now().UnixNano()
	mkdirs := func(dir string) error {
		p := ""
		for part := range strings.SplitSeq(dir, "/") {
			p = path.Join(p, part)
			if err := root.EnsureDir(p, 0o755); err != nil {
				return err
			}
			if err := root.SetMeta(p, confine.Meta{Mode: 0o755, MTime: now}); err != nil {
				return err
			}
		}
		return nil
	}
	base := strings.TrimPrefix(server.InstallDir, "/")
	if err := mkdirs(base); err != nil {
		return err
	}
	for _, f := range files {
		p := path.Join(base, f.Path)
		if !strings.HasPrefix(p, base+"/") {
			return fmt.Errorf("code-interpreter file %q is outside %s", f.Path, server.InstallDir)
		}
		if err := mkdirs(path.Dir(p)); err != nil {
			return err
		}
		if err := root.WriteFile(p, f.Data, f.Mode); err != nil {
			return fmt.Errorf("write %s: %w", p, err)
		}
		if err := root.SetMeta(p, confine.Meta{Mode: f.Mode, MTime: now}); err != nil {
			return fmt.Errorf("write %s: %w", p, err)
		}
	}
	return nil
}
