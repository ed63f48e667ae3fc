package sandbox

import (
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/space-sandbox/space/internal/egress"
	"github.com/space-sandbox/space/internal/egress/credentials"
	"github.com/space-sandbox/space/internal/errdefs"
	"github.com/space-sandbox/space/internal/store"
)

// Resources are a sandbox's limits as the API names them.
type Resources struct {
	VCPUs     int   `json:"vcpus"`
	MemoryMiB int64 `json:"memory_mib"`
	DiskMiB   int64 `json:"disk_mib"`
	// Pids bounds the sandbox's processes and threads, enforced on the host (under gVisor each
	// process inside costs host tasks too, so fewer than Pids fit); 0 is the driver's default.
	Pids int64 `json:"pids,omitempty"`
}

// Egress is a sandbox's egress policy, enforced by the egress gateway (internal/egress).
type Egress struct {
	Default string   `json:"default"`
	Allow   []string `json:"allow"`
	Deny    []string `json:"deny"`
	// Passthrough lists TLS names (rules as in Allow) the gateway splices end to end instead of
	// intercepting, for clients that pin certificates: their requests' Host is not checked
	// against the SNI ("fronting not checked" in the egress log). Every other TLS connection is
	// intercepted with the installation's CA (which every sandbox trusts), and each request's
	// Host must be the TLS server name.
	Passthrough []string `json:"passthrough,omitempty"`
	// Inspect is accepted for compatibility: interception is the default now, and Inspect
	// changes nothing.
	Inspect bool `json:"inspect,omitempty"`
}

// Network is a sandbox's network settings.
type Network struct {
	Egress      Egress   `json:"egress"`
	Credentials []string `json:"credentials"`
}

// Parent names what a sandbox was made from.
type Parent struct {
	SandboxID  string `json:"sandbox_id,omitempty"`
	SnapshotID string `json:"snapshot_id,omitempty"`
}

// AutoSnapshot asks for a filesystem snapshot every IntervalSeconds while the sandbox runs,
// when its files changed since its last snapshot; only the newest Keep automatic ones are kept.
type AutoSnapshot struct {
	IntervalSeconds int `json:"interval_seconds"`
	Keep            int `json:"keep"`
}

// Spec is the part of a sandbox's creation request kept in the store as JSON.
type Spec struct {
	Resources    Resources     `json:"resources"`
	Network      Network       `json:"network"`
	Parent       *Parent       `json:"parent,omitempty"`
	AutoSnapshot *AutoSnapshot `json:"auto_snapshot,omitempty"`
	// TrafficToken, when set, must accompany requests to the sandbox's ports through spaced's
	// host-name routing (E2B's trafficAccessToken).
	TrafficToken string `json:"traffic_token,omitempty"`
	// Command defaults from the template's image.
	WorkingDir string `json:"working_dir,omitempty"`
	User       string `json:"user,omitempty"`
	// Start is the template's service, started with the sandbox (see Service).
	Start *Service `json:"start,omitempty"`
	// The layers the sandbox was started on: a paused sandbox resumes on exactly these, and they
	// are kept while any sandbox names them.
	RootFS string   `json:"rootfs,omitempty"`
	Layers []string `json:"layers,omitempty"`
}

// CreateRequest asks for a new sandbox. Zero values take defaults.
type CreateRequest struct {
	Template       string
	Runtime        string
	TimeoutSeconds *int
	OnTimeout      string
	Env            map[string]string
	Metadata       map[string]string
	Resources      Resources
	Network        *Network
	FromSnapshot   string
	AutoSnapshot   *AutoSnapshot
	// TrafficToken asks for a token guarding the sandbox's ports (see Spec.TrafficToken).
	TrafficToken bool
}

// Info is a sandbox as the API shows it.
type Info struct {
	ID        string
	Tenant    string
	State     State
	Template  string
	Runtime   string
	CreatedAt time.Time
	ExpiresAt time.Time
	Metadata  map[string]string
	Spec      Spec
	Error     string
	OnTimeout string
}

func infoOf(rec store.Sandbox, spec Spec) Info {
	md := rec.Metadata
	if md == nil {
		md = map[string]string{}
	}
	return Info{
		ID: rec.ID, Tenant: rec.Tenant, State: State(rec.State), Template: rec.Template,
		Runtime: rec.Runtime, CreatedAt: rec.CreatedAt, ExpiresAt: rec.ExpiresAt,
		Metadata: md, Spec: spec, Error: rec.Error, OnTimeout: rec.OnTimeout,
	}
}

var (
	envKeyRE  = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	nameRE    = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)
	maxMapLen = 64
)

// maxMapBytes bounds the keys and values of one env or metadata map together.
const maxMapBytes = 64 << 10

// validateMap checks metadata or env maps: count, key shape and sizes.
func validateMap(field string, m map[string]string, keyRE *regexp.Regexp) error {
	if len(m) > maxMapLen {
		return errdefs.InvalidArgument(fmt.Sprintf("%s: at most %d entries", field, maxMapLen))
	}
	total := 0
	for k, v := range m {
		if total += len(k) + len(v); total > maxMapBytes {
			return errdefs.InvalidArgument(fmt.Sprintf("%s: keys and values over %d bytes in all", field, maxMapBytes))
		}
		if len(k) == 0 || len(k) > 128 || (keyRE != nil && !keyRE.MatchString(k)) {
			return errdefs.InvalidArgument(fmt.Sprintf("%s: invalid key %q", field, k))
		}
		if len(v) > 4096 || strings.ContainsRune(v, 0) {
			return errdefs.InvalidArgument(fmt.Sprintf("%s: value of %q is too long or contains NUL", field, k))
		}
	}
	return nil
}

// validateNetwork checks a network spec: the egress policy must parse.
func validateNetwork(n Network) error {
	for _, list := range [][]string{n.Egress.Allow, n.Egress.Deny, n.Egress.Passthrough} {
		if len(list) > 256 {
			return errdefs.InvalidArgument("network.egress: at most 256 entries per list")
		}
	}
	if _, err := egress.NewPolicy(n.Egress.Default, n.Egress.Allow, n.Egress.Deny); err != nil {
		return errdefs.InvalidArgument("network.egress: " + err.Error())
	}
	if _, err := egress.ParseRules(n.Egress.Passthrough); err != nil {
		return errdefs.InvalidArgument("network.egress.passthrough: " + err.Error())
	}
	if len(n.Credentials) > 16 {
		return errdefs.InvalidArgument("network.credentials: at most 16")
	}
	for _, c := range n.Credentials {
		if !credentials.ValidName(c) {
			return errdefs.InvalidArgument(fmt.Sprintf("network.credentials: %q is not a secret name", c))
		}
	}
	return nil
}

// The range of resources.pids: enough for a shell and a few commands, at most what one
// sandbox may hold of the host's process table.
const (
	minPids = 32
	maxPids = 65536
)

func validateResources(r Resources) error {
	if r.VCPUs < 0 || r.VCPUs > 64 {
		return errdefs.InvalidArgument("resources.vcpus: want 1..64")
	}
	if r.MemoryMiB != 0 && (r.MemoryMiB < 64 || r.MemoryMiB > 262144) {
		return errdefs.InvalidArgument("resources.memory_mib: want 64..262144")
	}
	if r.DiskMiB != 0 && (r.DiskMiB < 64 || r.DiskMiB > 1<<20) {
		return errdefs.InvalidArgument("resources.disk_mib: want 64..1048576")
	}
	if r.Pids != 0 && (r.Pids < minPids || r.Pids > maxPids) {
		return errdefs.InvalidArgument(fmt.Sprintf("resources.pids: want %d..%d", minPids, maxPids))
	}
	return nil
}
