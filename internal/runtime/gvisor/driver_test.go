package gvisor

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/space-sandbox/space/internal/errdefs"
	"github.com/space-sandbox/space/internal/runtime"
)

func testDriver(t *testing.T, cfg Config) *Driver {
	t.Helper()
	if cfg.Runsc == "" {
		cfg.Runsc = "/nonexistent/runsc"
	}
	if cfg.StateDir == "" {
		cfg.StateDir = t.TempDir()
	}
	if cfg.Instance == "" {
		cfg.Instance = "ab12"
	}
	d, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestNewValidates(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"ok", Config{Runsc: "runsc", StateDir: dir, Instance: "ab12"}, true},
		{"no runsc", Config{StateDir: dir, Instance: "ab12"}, false},
		{"no state dir", Config{Runsc: "runsc", Instance: "ab12"}, false},
		{"no instance", Config{Runsc: "runsc", StateDir: dir}, false},
		{"instance with a slash", Config{Runsc: "runsc", StateDir: dir, Instance: "a/b"}, false},
		{"instance upper case", Config{Runsc: "runsc", StateDir: dir, Instance: "AB12"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := New(tt.cfg)
			if (err == nil) != tt.ok {
				t.Fatalf("New: %v, want ok=%v", err, tt.ok)
			}
			if err != nil {
				if !errors.Is(err, errdefs.ErrInvalidArgument) {
					t.Errorf("err %v is not ErrInvalidArgument", err)
				}
				return
			}
			for _, sub := range []string{"runsc", "sandboxes"} {
				if st, err := os.Stat(filepath.Join(dir, sub)); err != nil || !st.IsDir() {
					t.Errorf("%s not created: %v", sub, err)
				}
			}
			if d.cfg.Platform != "systrap" || !filepath.IsAbs(d.cfg.Runsc) {
				t.Errorf("defaults not applied: %+v", d.cfg)
			}
		})
	}
}

func TestAvailableWithoutRunsc(t *testing.T) {
	d := testDriver(t, Config{Runsc: filepath.Join(t.TempDir(), "runsc")})
	err := d.Available(t.Context())
	if !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("Available = %v, want ErrUnavailable", err)
	}
}

func TestBundleSpec(t *testing.T) {
	const sb = "/state/sandboxes/sb1"
	base := runtime.Spec{
		ID: "sb1", RootFS: "/tpl/rootfs", AgentPath: "/bin/agent", AgentToken: "tok",
		Network: runtime.Network{NetNSPath: "/run/netns/space-ab12-1"},
	}
	mem := func(mib int64) *int64 { v := mib << 20; return &v }
	quota := func(cpus int64) *int64 { v := cpus * 100000; return &v }
	tests := []struct {
		name     string
		defaults runtime.Resources
		edit     func(*runtime.Spec)
		memory   *int64
		quota    *int64
		pids     int64
		env      []string
		hostname string
	}{
		{
			name: "package defaults", edit: func(*runtime.Spec) {},
			memory: mem(2048), quota: quota(1), pids: 4096*4 + 128,
			env:      []string{"HOME=/root", "PATH=" + defaultPath, "SPACE_AGENT_TOKEN=tok"},
			hostname: "sb1",
		},
		{
			name: "config defaults", defaults: runtime.Resources{VCPUs: 2, MemoryMiB: 512, Pids: 100},
			edit:   func(*runtime.Spec) {},
			memory: mem(512), quota: quota(2), pids: 100*4 + 128,
			env:      []string{"HOME=/root", "PATH=" + defaultPath, "SPACE_AGENT_TOKEN=tok"},
			hostname: "sb1",
		},
		{
			name: "explicit values and env", defaults: runtime.Resources{VCPUs: 2, MemoryMiB: 512},
			edit: func(s *runtime.Spec) {
				s.Resources = runtime.Resources{VCPUs: 4, MemoryMiB: 1000, Pids: 10}
				s.Env = map[string]string{"PATH": "/opt/bin", "A": "1", "SPACE_AGENT_TOKEN": "spoofed"}
				s.Hostname = "box"
			},
			memory: mem(1000), quota: quota(4), pids: 10*4 + 128,
			env:      []string{"A=1", "HOME=/root", "PATH=/opt/bin", "SPACE_AGENT_TOKEN=tok"},
			hostname: "box",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := testDriver(t, Config{Defaults: tt.defaults})
			spec := base
			tt.edit(&spec)
			got := d.bundleSpec(spec, sb, false)
			if diff := cmp.Diff(tt.env, got.Process.Env); diff != "" {
				t.Errorf("env (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff([]string{"/.space/space-agent"}, got.Process.Args); diff != "" {
				t.Errorf("args (-want +got):\n%s", diff)
			}
			if got.Process.User.UID != 0 || got.Process.Cwd != "/" {
				t.Errorf("user %+v cwd %q", got.Process.User, got.Process.Cwd)
			}
			if got.Hostname != tt.hostname {
				t.Errorf("hostname = %q, want %q", got.Hostname, tt.hostname)
			}
			if got.Root.Path != sb+"/rootfs" || got.Root.Readonly {
				t.Errorf("root = %+v", got.Root)
			}
			r := got.Linux.Resources
			if diff := cmp.Diff(tt.memory, r.Memory.Limit); diff != "" {
				t.Errorf("memory (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.quota, r.CPU.Quota); diff != "" {
				t.Errorf("cpu quota (-want +got):\n%s", diff)
			}
			if *r.CPU.Period != 100000 || r.Pids.Limit != tt.pids {
				t.Errorf("period %d pids %d, want 100000 and %d", *r.CPU.Period, r.Pids.Limit, tt.pids)
			}
			if got.Linux.CgroupsPath != "/space-ab12/sb1" {
				t.Errorf("cgroupsPath = %q", got.Linux.CgroupsPath)
			}
			var nsTypes []specs.LinuxNamespaceType
			for _, ns := range got.Linux.Namespaces {
				nsTypes = append(nsTypes, ns.Type)
				if ns.Type == specs.NetworkNamespace && ns.Path != "/run/netns/space-ab12-1" {
					t.Errorf("network namespace path = %q", ns.Path)
				}
			}
			wantNS := []specs.LinuxNamespaceType{specs.PIDNamespace, specs.IPCNamespace, specs.UTSNamespace, specs.MountNamespace, specs.NetworkNamespace}
			if diff := cmp.Diff(wantNS, nsTypes); diff != "" {
				t.Errorf("namespaces (-want +got):\n%s", diff)
			}
			mounts := map[string]specs.Mount{}
			for _, m := range got.Mounts {
				mounts[m.Destination] = m
			}
			for _, dst := range []string{"/proc", "/dev", "/dev/pts", "/dev/shm", "/sys", "/tmp", "/.space/space-agent"} {
				if _, ok := mounts[dst]; !ok {
					t.Errorf("no mount at %s", dst)
				}
			}
			if m := mounts["/tmp"]; m.Type != "bind" || m.Source != sb+"/rootfs/tmp" {
				t.Errorf("/tmp must be the rootfs's own directory, got %+v", m)
			}
			if m := mounts["/.space/space-agent"]; m.Source != sb+"/space-agent" || !slices.Contains(m.Options, "ro") {
				t.Errorf("agent mount = %+v, want read-only bind of the sandbox's copy", m)
			}
			if slices.Contains(got.Process.Capabilities.Bounding, "CAP_NET_RAW") || !slices.Contains(got.Process.Capabilities.Bounding, "CAP_SETUID") {
				t.Errorf("capabilities = %v", got.Process.Capabilities.Bounding)
			}
		})
	}
}

func TestValidateSpec(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "agent")
	os.WriteFile(file, []byte("x"), 0o755)
	comma := filepath.Join(dir, "a,b")
	os.Mkdir(comma, 0o755)
	good := runtime.Spec{ID: "sb-1_a.b", RootFS: dir, AgentPath: file}
	tests := []struct {
		name string
		edit func(*runtime.Spec)
		ok   bool
	}{
		{"good", func(*runtime.Spec) {}, true},
		{"empty ID", func(s *runtime.Spec) { s.ID = "" }, false},
		{"ID with slash", func(s *runtime.Spec) { s.ID = "a/b" }, false},
		{"ID dot dot", func(s *runtime.Spec) { s.ID = ".." }, false},
		{"ID too long", func(s *runtime.Spec) { s.ID = strings.Repeat("a", 129) }, false},
		{"relative rootfs", func(s *runtime.Spec) { s.RootFS = "rootfs" }, false},
		{"rootfs missing", func(s *runtime.Spec) { s.RootFS = dir + "/nope" }, false},
		{"rootfs is a file", func(s *runtime.Spec) { s.RootFS = file }, false},
		{"rootfs with comma", func(s *runtime.Spec) { s.RootFS = comma }, false},
		{"agent missing", func(s *runtime.Spec) { s.AgentPath = dir + "/nope" }, false},
		{"agent is a dir", func(s *runtime.Spec) { s.AgentPath = dir }, false},
		{"negative memory", func(s *runtime.Spec) { s.Resources.MemoryMiB = -1 }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec := good
			tt.edit(&spec)
			err := validateSpec(spec)
			if (err == nil) != tt.ok {
				t.Fatalf("validateSpec = %v, want ok=%v", err, tt.ok)
			}
			if err != nil && !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("err %v is not ErrInvalidArgument", err)
			}
		})
	}
}

func TestIsSandboxCmdline(t *testing.T) {
	root := []byte("--root=/s/runsc")
	tests := []struct {
		name    string
		cmdline string
		want    bool
	}{
		{"gofer", "runsc-gofer\x00--root=/s/runsc\x00gofer\x00--bundle\x00/b\x00sb1\x00", true},
		{"sandbox, flags reordered", "runsc-sandbox\x00--network=sandbox\x00--root=/s/runsc\x00boot\x00sb1\x00", true},
		{"other ID", "runsc-gofer\x00--root=/s/runsc\x00gofer\x00sb10\x00", false},
		{"other root", "runsc-gofer\x00--root=/other/runsc\x00gofer\x00sb1\x00", false},
		{"ID not last", "runsc\x00--root=/s/runsc\x00exec\x00sb1\x00/bin/echo\x00", false},
		{"ID only", "sb1\x00", false},
	}
	for _, tt := range tests {
		if got := isSandboxCmdline([]byte(tt.cmdline), root, "sb1"); got != tt.want {
			t.Errorf("%s: got %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestUnescapeMount(t *testing.T) {
	for in, want := range map[string]string{
		`/a/b`:      "/a/b",
		`/a\040b`:   "/a b",
		`/a\011b`:   "/a\tb",
		`/a\134`:    `/a\`,
		`/short\04`: `/short\04`,
		`/bad\09x`:  `/bad\09x`,
	} {
		if got := unescapeMount(in); got != want {
			t.Errorf("unescapeMount(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestExited(t *testing.T) {
	if exited(os.Getpid()) {
		t.Error("this process counts as exited")
	}
	if !exited(1 << 30) {
		t.Error("a PID that does not exist counts as alive")
	}
}

type fileInfo struct {
	Mode    uint32
	Size    int64
	Mtime   int64
	Target  string
	Content string
	Uid     uint32
	Xattr   string
}

// snapshotTree describes every entry under root, for comparing copies.
func snapshotTree(t *testing.T, root string) map[string]fileInfo {
	t.Helper()
	out := map[string]fileInfo{}
	err := filepath.Walk(root, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		fi := fileInfo{Mode: st.Mode, Mtime: st.Mtim.Nano(), Uid: st.Uid}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			b, _ := os.ReadFile(p)
			fi.Content, fi.Size = string(b), st.Size
		case unix.S_IFLNK:
			fi.Target, _ = os.Readlink(p)
		}
		buf := make([]byte, 256)
		if n, err := unix.Lgetxattr(p, "user.test", buf); err == nil {
			fi.Xattr = string(buf[:n])
		}
		out[rel] = fi
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestCopyTree(t *testing.T) {
	src, dst := t.TempDir(), t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(src, "a/b/c"), 0o755))
	must(os.WriteFile(filepath.Join(src, "a/file"), []byte("hello"), 0o640))
	must(os.WriteFile(filepath.Join(src, "a/b/c/deep"), []byte("deep"), 0o600))
	must(os.WriteFile(filepath.Join(src, "setuid"), []byte("#!"), 0o755))
	must(unix.Chmod(filepath.Join(src, "setuid"), 0o4755))
	must(os.Mkdir(filepath.Join(src, "sticky"), 0o755))
	must(unix.Chmod(filepath.Join(src, "sticky"), 0o1777))
	must(os.Symlink("../a/file", filepath.Join(src, "a/b/link")))
	must(os.Symlink("/dangling/target", filepath.Join(src, "dangling")))
	must(os.Link(filepath.Join(src, "a/file"), filepath.Join(src, "hardlink")))
	must(unix.Mkfifo(filepath.Join(src, "fifo"), 0o600))
	big := strings.Repeat("0123456789", 200000)
	must(os.WriteFile(filepath.Join(src, "big"), []byte(big), 0o644))
	xattrs := unix.Lsetxattr(filepath.Join(src, "a/file"), "user.test", []byte("v1"), 0) == nil
	old := time.Date(2001, 2, 3, 4, 5, 6, 7, time.UTC)
	for _, p := range []string{"a/file", "a/b/c", "a", "big"} {
		must(os.Chtimes(filepath.Join(src, p), old, old))
	}
	if os.Geteuid() == 0 {
		// An overlay whiteout and opaque directory, as in a real upper layer.
		must(unix.Mknod(filepath.Join(src, "whiteout"), unix.S_IFCHR, 0))
		must(os.Mkdir(filepath.Join(src, "opaque"), 0o755))
		must(unix.Lsetxattr(filepath.Join(src, "opaque"), "trusted.overlay.opaque", []byte("y"), 0))
		must(os.Lchown(filepath.Join(src, "a/file"), 1000, 1000))
	}

	must(copyTree(src, dst))
	// A fifo never reaches the host copy; the rest is as it was.
	if _, err := os.Lstat(filepath.Join(dst, "fifo")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("fifo copied: %v", err)
	}
	before, err := os.Lstat(src)
	must(err)
	must(os.Remove(filepath.Join(src, "fifo")))
	must(os.Chtimes(src, before.ModTime(), before.ModTime()))

	want, got := snapshotTree(t, src), snapshotTree(t, dst)
	// Set-id bits never reach the host copy.
	w := want["setuid"]
	w.Mode &^= uint32(syscall.S_ISUID | syscall.S_ISGID)
	want["setuid"] = w
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("copy differs (-src +dst):\n%s", diff)
	}
	if !xattrs {
		t.Log("filesystem without user xattrs: not checked")
	}
	var a, h syscall.Stat_t
	must(syscall.Stat(filepath.Join(dst, "a/file"), &a))
	must(syscall.Stat(filepath.Join(dst, "hardlink"), &h))
	if a.Ino != h.Ino {
		t.Error("hard link became two files")
	}
	if os.Geteuid() == 0 {
		buf := make([]byte, 8)
		n, err := unix.Lgetxattr(filepath.Join(dst, "opaque"), "trusted.overlay.opaque", buf)
		if err != nil || string(buf[:n]) != "y" {
			t.Errorf("opaque xattr: %q, %v", buf[:n], err)
		}
		var w unix.Stat_t
		must(unix.Lstat(filepath.Join(dst, "whiteout"), &w))
		if w.Mode&unix.S_IFMT != unix.S_IFCHR || w.Rdev != 0 {
			t.Errorf("whiteout mode %o rdev %d", w.Mode, w.Rdev)
		}
	}
}

func TestCopyTreeRejectsFile(t *testing.T) {
	f := filepath.Join(t.TempDir(), "f")
	os.WriteFile(f, nil, 0o644)
	if err := copyTree(f, t.TempDir()); err == nil {
		t.Error("copyTree of a file succeeded")
	}
}

func TestCheckpointManifest(t *testing.T) {
	dir := t.TempDir()
	if _, err := readManifest(dir); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("empty dir: %v, want ErrInvalidArgument", err)
	}
	if _, err := readManifest(filepath.Join(dir, "nope")); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("missing dir: %v, want ErrNotFound", err)
	}
	os.Mkdir(filepath.Join(dir, "upper"), 0o755)
	if err := writeManifest(dir, manifest{SandboxID: "sb1", RootFS: "/t/rootfs"}, true); err != nil {
		t.Fatal(err)
	}
	if m, err := readManifest(dir); err != nil || m.SandboxID != "sb1" || m.RootFS != "/t/rootfs" || m.Driver != Name {
		t.Errorf("after writeManifest: %+v, %v", m, err)
	}
	os.WriteFile(filepath.Join(dir, manifestFile), []byte(`{"driver":"firecracker","format":1}`), 0o644)
	if _, err := readManifest(dir); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("other driver's checkpoint: %v, want ErrInvalidArgument", err)
	}
	os.WriteFile(filepath.Join(dir, manifestFile), []byte(`{"driver":"gvisor","format":99}`), 0o644)
	if _, err := readManifest(dir); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("future format: %v, want ErrInvalidArgument", err)
	}
}

func TestStateAndListWithoutSandboxes(t *testing.T) {
	d := testDriver(t, Config{})
	ids, err := d.List(t.Context())
	if err != nil || len(ids) != 0 {
		t.Errorf("List = %v, %v", ids, err)
	}
	for _, dir := range []string{"sb-2", "sb-1", ".hidden"} {
		os.Mkdir(filepath.Join(d.sandboxes, dir), 0o700)
	}
	os.WriteFile(filepath.Join(d.sandboxes, "stray-file"), nil, 0o600)
	ids, err = d.List(t.Context())
	if diff := cmp.Diff([]string{"sb-1", "sb-2"}, ids); diff != "" || err != nil {
		t.Errorf("List (-want +got), err %v:\n%s", err, diff)
	}
	if _, err := d.State(t.Context(), "../x"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("State of an invalid ID: %v", err)
	}
	if err := d.Delete(t.Context(), "a/b"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("Delete of an invalid ID: %v", err)
	}
}

// TestMemoryLimitCoversSwap: on a host with accounted swap the memory limit bounds memory and
// swap together; without, no swap limit is asked of runsc (it could not apply one).
func TestMemoryLimitCoversSwap(t *testing.T) {
	d := testDriver(t, Config{})
	d.limitSwap = true
	if m := d.memoryLimit(1 << 30); m.Swap == nil || *m.Swap != 1<<30 || *m.Limit != 1<<30 {
		t.Fatalf("with swap: %+v", m)
	}
	d.limitSwap = false
	if m := d.memoryLimit(1 << 30); m.Swap != nil {
		t.Fatalf("without swap: swap %d", *m.Swap)
	}
}
