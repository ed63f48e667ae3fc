package image

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/space-sandbox/space/internal/errdefs"
	"github.com/space-sandbox/space/internal/testutil"
)

// anonymous is a keychain with no credentials, so tests never read the host's Docker config.
var anonymous = authn.NewMultiKeychain()

// staticKeychain hands out one username and password for every registry.
type staticKeychain struct{ user, pass string }

func (k staticKeychain) Resolve(authn.Resource) (authn.Authenticator, error) {
	return authn.FromConfig(authn.AuthConfig{Username: k.user, Password: k.pass}), nil
}

func layerOf(t testing.TB, ents ...ent) v1.Layer {
	t.Helper()
	b := tarBytes(t, ents...)
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// wantConfig is the config of testImage.
var wantConfig = Config{
	Env:        []string{"PATH=/usr/bin:/bin", "FOO=bar"},
	WorkingDir: "/work",
	User:       "1000:1000",
	Entrypoint: []string{"/bin/sh", "-c"},
	Cmd:        []string{"echo hi"},
}

// testImage is three layers exercising whiteouts, an opaque directory, symlinks, a hardlink, a
// FIFO, a set-uid file and a device node, built for arch.
func testImage(t testing.TB, arch string) v1.Image {
	t.Helper()
	dir := func(n string) ent { return ent{name: n, typ: tar.TypeDir} }
	l1 := layerOf(t,
		dir("etc/"), ent{name: "etc/passwd", body: "root:x:0:0"}, ent{name: "etc/gone", body: "bye"},
		dir("opq/"), ent{name: "opq/old", body: "old"}, dir("opq/olddir/"), ent{name: "opq/olddir/f", body: "f"},
		dir("usr/"), dir("usr/bin/"), ent{name: "usr/bin/tool", body: "#!tool", mode: 0o755},
		ent{name: "bin", typ: tar.TypeSymlink, link: "usr/bin"},
		dir("dev/"), ent{name: "dev/null", typ: tar.TypeChar, major: 1, minor: 3},
	)
	l2 := layerOf(t,
		dir("etc/"), ent{name: "etc/.wh.gone"},
		dir("opq/"), ent{name: "opq/.wh..wh..opq"}, ent{name: "opq/new", body: "new"},
		dir("usr/bin/"), ent{name: "usr/bin/hard", typ: tar.TypeLink, link: "usr/bin/tool"},
		ent{name: "usr/bin/su", body: "su", mode: 0o4755},
		ent{name: "link", typ: tar.TypeSymlink, link: "/usr/bin/tool"},
		dir("run/"), ent{name: "run/fifo", typ: tar.TypeFifo, mode: 0o600},
	)
	l3 := layerOf(t, dir("./etc/"), ent{name: "./etc/passwd", body: "root:x:0:0:new"}, dir("work/"))
	img, err := mutate.AppendLayers(empty.Image, l1, l2, l3)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", arch
	cf.Config.Env, cf.Config.WorkingDir, cf.Config.User = wantConfig.Env, wantConfig.WorkingDir, wantConfig.User
	cf.Config.Entrypoint, cf.Config.Cmd = wantConfig.Entrypoint, wantConfig.Cmd
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	return img
}

// wantTree is testImage unpacked.
func wantTree() map[string]string {
	ts := " " + testTime.Format(time.RFC3339)
	d := "drwxr-xr-x" + ts
	return map[string]string{
		"etc": d, "etc/passwd": "-rw-r--r--" + ts + " root:x:0:0:new",
		"opq": d, "opq/new": "-rw-r--r--" + ts + " new",
		"usr": d, "usr/bin": d,
		"usr/bin/tool": "-rwxr-xr-x" + ts + " #!tool",
		"usr/bin/hard": "-rwxr-xr-x" + ts + " #!tool",
		"usr/bin/su":   "-rwxr-xr-x" + ts + " su", // set-id bits never reach the host
		"bin":          "Lrwxrwxrwx" + ts + " -> usr/bin",
		"link":         "Lrwxrwxrwx" + ts + " -> /usr/bin/tool",
		"dev":          d,
		"run":          d, // fifos never reach the host
		"work":         d,
	}
}

// startRegistry serves an in-memory registry on 127.0.0.1, wrapped by wrap if not nil, and
// returns its host:port.
func startRegistry(t testing.TB, wrap func(http.Handler) http.Handler) string {
	t.Helper()
	var h http.Handler = registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	if wrap != nil {
		h = wrap(h)
	}
	srv := httptest.NewServer(h) // listens on 127.0.0.1
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

func push(t testing.TB, ref string, img v1.Image, opts ...remote.Option) {
	t.Helper()
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img, opts...); err != nil {
		t.Fatalf("push %s: %v", ref, err)
	}
}

func TestUnpackSources(t *testing.T) {
	img := testImage(t, "amd64")
	digest, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	host := startRegistry(t, nil)
	push(t, host+"/test/img:v1", img)

	// An index whose first entry is another platform: linux/amd64 must be picked.
	idx := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: testImage(t, "arm64"), Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm64"}}},
		mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}}},
	)
	multi, err := name.ParseReference(host + "/test/multi:v1")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteIndex(multi, idx); err != nil {
		t.Fatal(err)
	}

	layoutDir := t.TempDir()
	lp, err := layout.Write(layoutDir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendIndex(idx); err != nil {
		t.Fatal(err)
	}

	tarPath := filepath.Join(t.TempDir(), "img.tar")
	if err := tarball.WriteToFile(tarPath, name.MustParseReference("test/img:v1"), img); err != nil {
		t.Fatal(err)
	}

	progressLine := regexp.MustCompile(`^pulling layer [1-3]/3 sha256:[0-9a-f]{12}… \(\d+(\.\d)? (B|KiB)\)$`)
	for _, tc := range []struct {
		name       string
		src        Source
		wantDigest bool // the tarball image's manifest is rebuilt, so its digest differs
	}{
		{"registry", Source{Ref: host + "/test/img:v1"}, true},
		{"registry by digest", Source{Ref: host + "/test/img@" + digest.String()}, true},
		{"registry index", Source{Ref: host + "/test/multi:v1"}, true},
		{"localhost name", Source{Ref: "localhost:" + strings.Split(host, ":")[1] + "/test/img:v1"}, true},
		{"oci layout with index", Source{Layout: layoutDir}, true},
		{"docker save tarball", Source{Tarball: tarPath}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dest := t.TempDir()
			var progress []string
			cfg, err := Unpack(t.Context(), tc.src, dest, Options{Keychain: anonymous, Progress: func(m string) { progress = append(progress, m) }})
			if err != nil {
				t.Fatalf("Unpack: %v", err)
			}
			want := wantConfig
			want.Digest = cfg.Digest
			if tc.wantDigest {
				want.Digest = digest.String()
			}
			if diff := cmp.Diff(want, cfg); diff != "" {
				t.Errorf("config (-want +got):\n%s", diff)
			}
			if !strings.HasPrefix(cfg.Digest, "sha256:") {
				t.Errorf("digest %q", cfg.Digest)
			}
			if diff := cmp.Diff(wantTree(), describe(t, dest, false)); diff != "" {
				t.Errorf("tree (-want +got):\n%s", diff)
			}
			assertSameFile(t, filepath.Join(dest, "usr/bin/tool"), filepath.Join(dest, "usr/bin/hard"))
			var pulls int
			for _, m := range progress {
				if strings.HasPrefix(m, "pulling layer") {
					pulls++
					if !progressLine.MatchString(m) {
						t.Errorf("progress line %q does not match %v", m, progressLine)
					}
				}
			}
			if pulls != 3 {
				t.Errorf("progress %q: want 3 pulling lines", progress)
			}
		})
	}
}

func assertSameFile(t *testing.T, a, b string) {
	t.Helper()
	fa, errA := os.Lstat(a)
	fb, errB := os.Lstat(b)
	if errA != nil || errB != nil || !os.SameFile(fa, fb) {
		t.Errorf("%s and %s are not one hardlinked file (%v, %v)", a, b, errA, errB)
	}
}

// TestUnpackOwnership needs root to chown.
func TestUnpackOwnership(t *testing.T) {
	testutil.RequiresRoot(t)
	l := layerOf(t,
		ent{name: "home/", typ: tar.TypeDir, uid: 1000, gid: 1000},
		ent{name: "home/f", body: "x", uid: 1000, gid: 2000, mode: 0o2755},
		ent{name: "home/l", typ: tar.TypeSymlink, link: "f", uid: 1001, gid: 1001},
		ent{name: "root", typ: tar.TypeDir, mode: 0o700},
	)
	img, err := mutate.AppendLayers(empty.Image, l)
	if err != nil {
		t.Fatal(err)
	}
	lp := t.TempDir()
	p, err := layout.Write(lp, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	dest := t.TempDir()
	if _, err := Unpack(t.Context(), Source{Layout: lp}, dest, Options{}); err != nil {
		t.Fatal(err)
	}
	ts := " " + testTime.Format(time.RFC3339)
	want := map[string]string{
		"home":   "drwxr-xr-x" + ts + " 1000:1000",
		"home/f": "-rwxr-xr-x" + ts + " x 1000:2000", // set-id bits never reach the host
		"home/l": "Lrwxrwxrwx" + ts + " -> f 1001:1001",
		"root":   "drwx------" + ts + " 0:0",
	}
	if diff := cmp.Diff(want, describe(t, dest, true)); diff != "" {
		t.Errorf("tree (-want +got):\n%s", diff)
	}
}

func TestUnpackErrors(t *testing.T) {
	img := testImage(t, "amd64")
	host := startRegistry(t, nil)
	push(t, host+"/test/img:v1", img)
	push(t, host+"/test/arm:v1", testImage(t, "arm64"))

	authHost := startRegistry(t, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if u, p, ok := r.BasicAuth(); !ok || u != "alice" || p != "secret" {
				w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusUnauthorized)
				io.WriteString(w, `{"errors":[{"code":"UNAUTHORIZED","message":"log in"}]}`)
				return
			}
			h.ServeHTTP(w, r)
		})
	})
	push(t, authHost+"/test/img:v1", img, remote.WithAuth(&authn.Basic{Username: "alice", Password: "secret"}))

	deniedHost := startRegistry(t, func(http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/v2/" {
				return // the ping succeeds
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusForbidden)
			io.WriteString(w, `{"errors":[{"code":"DENIED","message":"no"}]}`)
		})
	})

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()

	full := t.TempDir()
	if err := os.WriteFile(filepath.Join(full, "x"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	notDir := filepath.Join(full, "x")
	garbage := filepath.Join(t.TempDir(), "garbage.tar")
	if err := os.WriteFile(garbage, []byte("not a tarball"), 0o644); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name    string
		src     Source
		dest    string // "" means a fresh empty directory
		kc      authn.Keychain
		want    error // nil means success
		message string
	}{
		{name: "unknown repository", src: Source{Ref: host + "/nope/nope:v1"}, want: errdefs.ErrNotFound, message: "image " + host + "/nope/nope:v1 not found"},
		{name: "unknown tag", src: Source{Ref: host + "/test/img:v2"}, want: errdefs.ErrNotFound},
		{name: "unreachable registry", src: Source{Ref: closed + "/x:v1"}, want: errdefs.ErrUnavailable, message: "registry " + closed + " unreachable"},
		{name: "bad reference", src: Source{Ref: "UPPER/Case::x"}, want: errdefs.ErrInvalidArgument},
		{name: "no credentials", src: Source{Ref: authHost + "/test/img:v1"}, want: errdefs.ErrPermissionDenied},
		{name: "wrong credentials", src: Source{Ref: authHost + "/test/img:v1"}, kc: staticKeychain{"alice", "nope"}, want: errdefs.ErrPermissionDenied},
		{name: "credentials from keychain", src: Source{Ref: authHost + "/test/img:v1"}, kc: staticKeychain{"alice", "secret"}},
		{name: "forbidden", src: Source{Ref: deniedHost + "/test/img:v1"}, want: errdefs.ErrPermissionDenied},
		{name: "other platform", src: Source{Ref: host + "/test/arm:v1"}, want: errdefs.ErrInvalidArgument},
		{name: "missing layout", src: Source{Layout: filepath.Join(full, "nope")}, want: errdefs.ErrNotFound},
		{name: "layout without index", src: Source{Layout: full}, want: errdefs.ErrNotFound},
		{name: "missing tarball", src: Source{Tarball: filepath.Join(full, "nope.tar")}, want: errdefs.ErrNotFound},
		{name: "garbage tarball", src: Source{Tarball: garbage}, want: errdefs.ErrInvalidArgument},
		{name: "no source", src: Source{}, want: errdefs.ErrInvalidArgument},
		{name: "two sources", src: Source{Ref: host + "/test/img:v1", Layout: full}, want: errdefs.ErrInvalidArgument},
		{name: "dest not empty", src: Source{Ref: host + "/test/img:v1"}, dest: full, want: errdefs.ErrFailedPrecondition},
		{name: "dest is a file", src: Source{Ref: host + "/test/img:v1"}, dest: notDir, want: errdefs.ErrInvalidArgument},
		{name: "dest missing", src: Source{Ref: host + "/test/img:v1"}, dest: filepath.Join(full, "nope"), want: errdefs.ErrInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dest := tc.dest
			if dest == "" {
				dest = t.TempDir()
			}
			kc := tc.kc
			if kc == nil {
				kc = anonymous
			}
			start := time.Now()
			_, err := Unpack(t.Context(), tc.src, dest, Options{Keychain: kc})
			if elapsed := time.Since(start); elapsed > 4*time.Second {
				t.Errorf("took %v; errors must come fast", elapsed)
			}
			t.Logf("error after %v: %v", time.Since(start).Round(time.Millisecond), err)
			if tc.want == nil {
				if err != nil {
					t.Fatalf("Unpack: %v", err)
				}
				return
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("error %v; want class %v", err, tc.want)
			}
			if !strings.Contains(err.Error(), tc.message) {
				t.Errorf("error %q does not contain %q", err, tc.message)
			}
		})
	}
}

// TestUnpackRefusesMaliciousImage checks that a layer escaping through a symlink planted by an
// earlier layer fails Unpack as an invalid argument, naming the entry, with nothing written
// outside dest.
func TestUnpackRefusesMaliciousImage(t *testing.T) {
	base, dest, sentinel := sandboxDirs(t)
	img, err := mutate.AppendLayers(empty.Image,
		layerOf(t, ent{name: "a", typ: tar.TypeSymlink, link: sentinel}),
		layerOf(t, ent{name: "a/keep", body: "pwned"}),
	)
	if err != nil {
		t.Fatal(err)
	}
	host := startRegistry(t, nil)
	push(t, host+"/evil:v1", img)
	_, err = Unpack(t.Context(), Source{Ref: host + "/evil:v1"}, dest, Options{Keychain: anonymous})
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), `"a/keep"`) {
		t.Fatalf("error %v; want an invalid argument naming a/keep", err)
	}
	if b, err := os.ReadFile(filepath.Join(sentinel, "keep")); err != nil || string(b) != "sentinel" {
		t.Errorf("sentinel = %q, %v", b, err)
	}
	if diff := cmp.Diff([]string{"root", "sentinel"}, listing(t, base)); diff != "" {
		t.Errorf("files appeared next to dest (-want +got):\n%s", diff)
	}
}

func TestHumanSize(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1536: "1.5 KiB", 12897485: "12.3 MiB", 5 << 30: "5.0 GiB", 3 << 40: "3072.0 GiB"} {
		if got := humanSize(n); got != want {
			t.Errorf("humanSize(%d) = %q; want %q", n, got, want)
		}
	}
	if got := shortDigest("sha256:0123456789abcdef0123"); got != "sha256:0123456789ab…" {
		t.Errorf("shortDigest = %q", got)
	}
}

func TestIsLoopback(t *testing.T) {
	for host, want := range map[string]bool{
		"localhost:5000": true, "LOCALHOST": true, "127.0.0.1:5000": true, "127.9.9.9": true, "[::1]:5000": true,
		"index.docker.io": false, "10.0.0.1:5000": false, "localhost.example.com": false, "[::2]:1": false,
	} {
		if got := isLoopback(host); got != want {
			t.Errorf("isLoopback(%q) = %v; want %v", host, got, want)
		}
	}
}
