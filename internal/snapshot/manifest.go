package snapshot

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"regexp"
	"time"

	"github.com/space-sandbox/space/internal/cas"
	"github.com/space-sandbox/space/internal/errdefs"
	"github.com/space-sandbox/space/internal/fstree"
	"github.com/space-sandbox/space/internal/store"
)

// Snapshot kinds.
const (
	KindFilesystem = "filesystem" // the files of the writable layer
	KindFull       = "full"       // memory, processes and files of one instant
)

// MaxLabel bounds a snapshot's label.
const MaxLabel = 128

// Info is a snapshot as the API shows it.
type Info struct {
	ID          string    `json:"id"`
	SandboxID   string    `json:"sandbox_id"`
	Kind        string    `json:"kind"`
	Label       string    `json:"label"`
	ParentID    string    `json:"parent_id"`
	CreatedAt   time.Time `json:"created_at"`
	SizeBytes   int64     `json:"size_bytes"`
	StoredBytes int64     `json:"stored_bytes"`
}

// InfoOf returns the API view of a snapshot record.
func InfoOf(s store.Snapshot) Info {
	return Info{ID: s.ID, SandboxID: s.SandboxID, Kind: s.Kind, Label: s.Label, ParentID: s.ParentID,
		CreatedAt: s.CreatedAt, SizeBytes: s.SizeBytes, StoredBytes: s.StoredBytes}
}

// Request asks for a snapshot.
type Request struct {
	Kind  string
	Label string
	// OnlyIfChanged skips a filesystem snapshot whose files equal the sandbox's latest
	// snapshot (automatic snapshots); the result is then the zero Info.
	OnlyIfChanged bool
}

var idRE = regexp.MustCompile(`^snp_[0-9a-z]{20}$`)

// ValidID reports whether s has the shape of a snapshot ID.
func ValidID(s string) bool { return idRE.MatchString(s) }

// Chunks is the chunk store snapshots live in (internal/cas).
type Chunks interface {
	Begin() *cas.Txn
	Root(name string) (json.RawMessage, error)
	RootChunks(name string) ([]string, error)
	StoredSize(h string) (int64, bool)
	Roots() ([]string, error)
	Delete(name string) error
	WriteTo(w io.Writer, chunks []cas.Chunk) (int64, error)
}

// ManifestVersion is the manifest format this package writes and reads.
const ManifestVersion = 1

// Manifest is a snapshot's content description, kept as the chunk store root of its ID.
type Manifest struct {
	Version   int    `json:"version"`
	Kind      string `json:"kind"`
	SandboxID string `json:"sandbox_id"`
	// What the sandbox was: a sandbox made from the snapshot starts like it.
	Template string            `json:"template"`
	Runtime  string            `json:"runtime"`
	Env      map[string]string `json:"env,omitempty"`
	// Spec is the sandbox's spec as internal/sandbox keeps it; of it this package reads only the
	// layers (RootFS and Layers).
	Spec       json.RawMessage `json:"spec"`
	AgentToken string          `json:"agent_token,omitempty"` // the token in a full snapshot's memory
	Upper      fstree.Tree     `json:"upper"`                 // the writable layer
	// Private holds the shared layers (of a fork or an earlier snapshot) among Layers, by path,
	// so that the snapshot can bring them back if they are gone.
	Private    map[string]fstree.Tree `json:"private,omitempty"`
	Checkpoint *fstree.Tree           `json:"checkpoint,omitempty"` // full: the runtime's image without the layer

	// From Spec: the template's root file system and the layers over it, bottom first.
	RootFS string   `json:"-"`
	Layers []string `json:"-"`
}

// NewManifest starts the manifest of a snapshot of kind taken of a sandbox with spec.
func NewManifest(kind, sandboxID, template, runtime string, env map[string]string, spec json.RawMessage) (*Manifest, error) {
	mf := &Manifest{Version: ManifestVersion, Kind: kind, SandboxID: sandboxID, Template: template,
		Runtime: runtime, Env: env, Spec: spec}
	if err := mf.decodeLayers(); err != nil {
		return nil, err
	}
	return mf, nil
}

func (mf *Manifest) decodeLayers() error {
	var l struct {
		RootFS string   `json:"rootfs"`
		Layers []string `json:"layers"`
	}
	if len(mf.Spec) > 0 {
		if err := json.Unmarshal(mf.Spec, &l); err != nil {
			return fmt.Errorf("manifest spec: %w", err)
		}
	}
	mf.RootFS, mf.Layers = l.RootFS, l.Layers
	return nil
}

// Decode reads the manifest of snapshot sid from its root's data.
func Decode(sid string, data []byte) (*Manifest, error) {
	var mf Manifest
	if err := json.Unmarshal(data, &mf); err != nil {
		return nil, fmt.Errorf("snapshot %s: %w: %v", sid, cas.ErrCorrupt, err)
	}
	if mf.Version != ManifestVersion {
		return nil, fmt.Errorf("snapshot %s has format %d; this server reads %d", sid, mf.Version, ManifestVersion)
	}
	if err := mf.decodeLayers(); err != nil {
		return nil, fmt.Errorf("snapshot %s: %w: %v", sid, cas.ErrCorrupt, err)
	}
	return &mf, nil
}

// Chunks lists the chunks the manifest's trees refer to.
func (mf *Manifest) Chunks() []string {
	out := mf.Upper.Chunks()
	for _, t := range mf.Private {
		out = append(out, t.Chunks()...)
	}
	if mf.Checkpoint != nil {
		out = append(out, mf.Checkpoint.Chunks()...)
	}
	return out
}

// Size is the snapshot's size: its writable layer and, if full, the runtime's image.
func (mf *Manifest) Size() int64 {
	n := mf.Upper.Size()
	if mf.Checkpoint != nil {
		n += mf.Checkpoint.Size()
	}
	return n
}

// CheckLayers makes sure the template layers a snapshot was taken on still exist.
func (mf *Manifest) CheckLayers() error {
	for _, l := range append([]string{mf.RootFS}, mf.Layers...) {
		if _, ok := mf.Private[l]; l == "" || ok {
			continue
		}
		//confine:host spaced's state directories and layer directories by their own paths, not paths inside them
		if _, err := os.Stat(l); err != nil {
			return errdefs.New(errdefs.ErrFailedPrecondition, fmt.Sprintf("the template version this snapshot was taken on (%s) is gone", mf.Template))
		}
	}
	return nil
}
