package template

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/space-sandbox/space/internal/errdefs"
	"github.com/space-sandbox/space/internal/testutil"
)

func TestBaseVersion(t *testing.T) {
	s, _ := newStore(t, "/bin/busybox")
	version := func(spec baseSpec, aptDir string) string {
		t.Helper()
		v, err := s.version("base", baseRecipeFrom(spec, aptDir))
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	def := version(defaultBaseSpec(), "/etc/apt")
	if registered := must(s.version("base", s.recipes["base"])); registered != def {
		t.Errorf("registered base recipe has version %s, want the default spec's %s", registered, def)
	}
	if minimal := must(s.version("minimal", s.recipes["minimal"])); minimal == def {
		t.Error("base and minimal have the same version")
	}
	tests := []struct {
		name    string
		change  func(*baseSpec)
		aptDir  string
		changed bool
	}{
		{"same spec", func(*baseSpec) {}, "/etc/apt", false},
		{"other mirror configuration", func(*baseSpec) {}, t.TempDir(), false},
		{"packages reordered", func(b *baseSpec) { slices.Reverse(b.packages) }, "/etc/apt", false},
		{"package added", func(b *baseSpec) { b.packages = append(b.packages, "iproute2") }, "/etc/apt", true},
		{"package removed", func(b *baseSpec) {
			b.packages = slices.DeleteFunc(b.packages, func(p string) bool { return p == "npm" })
		}, "/etc/apt", true},
		{"package renamed", func(b *baseSpec) { b.packages[0] += "-dbg" }, "/etc/apt", true},
		{"other suite", func(b *baseSpec) { b.suite = "trixie" }, "/etc/apt", true},
		{"other variant", func(b *baseSpec) { b.variant = "buildd" }, "/etc/apt", true},
		{"dpkg option dropped", func(b *baseSpec) { b.dpkgOpts = b.dpkgOpts[1:] }, "/etc/apt", true},
		{"apt option added", func(b *baseSpec) { b.aptOpts = append(b.aptOpts, `Apt::Install-Recommends "true"`) }, "/etc/apt", true},
		{"hook changed", func(b *baseSpec) { b.hooks[0] += " --comment x" }, "/etc/apt", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec := defaultBaseSpec()
			tt.change(&spec)
			if got := version(spec, tt.aptDir); (got != def) != tt.changed {
				t.Errorf("version %s, default %s: changed = %v, want %v", got, def, got != def, tt.changed)
			}
			// The change did not leak into the default spec.
			if again := version(defaultBaseSpec(), "/etc/apt"); again != def {
				t.Errorf("default version moved from %s to %s", def, again)
			}
		})
	}
	// The recipe version is part of the hash too.
	rec := baseRecipe("/etc/apt")
	rec.version++
	if v := must(s.version("base", rec)); v == def {
		t.Error("recipe version bump did not change the version")
	}
}

func TestParseOneLineSources(t *testing.T) {
	tests := []struct {
		name string
		text string
		want []aptSource
	}{
		{"empty", "", nil},
		{"comments and blanks", "# deb http://x/debian bookworm main\n\n   \n", nil},
		{"simple", "deb http://deb.debian.org/debian bookworm main contrib\n",
			[]aptSource{{Types: []string{"deb"}, URIs: []string{"http://deb.debian.org/debian"}, Suites: []string{"bookworm"}, Components: []string{"main", "contrib"}}}},
		{"options in one field", "deb [arch=amd64] http://m/debian bookworm main\n",
			[]aptSource{{Types: []string{"deb"}, URIs: []string{"http://m/debian"}, Suites: []string{"bookworm"}, Components: []string{"main"}}}},
		{"options with spaces and trailing comment", "deb [ arch=amd64 signed-by=/k.gpg ] http://m/debian-security bookworm-security main # sec\n",
			[]aptSource{{Types: []string{"deb"}, URIs: []string{"http://m/debian-security"}, Suites: []string{"bookworm-security"}, Components: []string{"main"}}}},
		{"deb-src and flat repository", "deb-src http://m/debian bookworm main\ndeb http://flat/repo ./\n",
			[]aptSource{
				{Types: []string{"deb-src"}, URIs: []string{"http://m/debian"}, Suites: []string{"bookworm"}, Components: []string{"main"}},
				{Types: []string{"deb"}, URIs: []string{"http://flat/repo"}, Suites: []string{"./"}, Components: []string{}},
			}},
		{"malformed lines skipped", "deb\ndeb http://only-uri\ndeb [arch=amd64 http://m/debian bookworm main\n", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, parseOneLineSources(tt.text)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// hostLikeSources is the deb822 file of a stock Debian 12 container image.
const hostLikeSources = `Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
# http://snapshot.debian.org/archive/debian-security/20250520T000000Z
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
`

func TestParseDeb822Sources(t *testing.T) {
	tests := []struct {
		name string
		text string
		want []aptSource
	}{
		{"empty", "", nil},
		{"stock debian 12", hostLikeSources, []aptSource{
			{Types: []string{"deb"}, URIs: []string{"http://deb.debian.org/debian"}, Suites: []string{"bookworm", "bookworm-updates"}, Components: []string{"main"}},
			{Types: []string{"deb"}, URIs: []string{"http://deb.debian.org/debian-security"}, Suites: []string{"bookworm-security"}, Components: []string{"main"}},
		}},
		{"case-insensitive fields, several blank lines, CRLF", "types: deb deb-src\r\nURIS: http://a/debian http://b/debian\r\nsuites: trixie\r\ncomponents: main non-free\r\n\r\n\r\n",
			[]aptSource{{Types: []string{"deb", "deb-src"}, URIs: []string{"http://a/debian", "http://b/debian"}, Suites: []string{"trixie"}, Components: []string{"main", "non-free"}}}},
		{"disabled stanza", "Enabled: no\nTypes: deb\nURIs: http://off/debian\nSuites: bookworm\n\nTypes: deb\nURIs: http://on/debian\nSuites: bookworm\nEnabled: yes\n",
			[]aptSource{{Types: []string{"deb"}, URIs: []string{"http://on/debian"}, Suites: []string{"bookworm"}, Components: []string{}}}},
		{"inline key as continuation lines", "Types: deb\nURIs: http://m/debian\nSigned-By:\n -----BEGIN PGP PUBLIC KEY BLOCK-----\n .\n mQINBF\n -----END PGP PUBLIC KEY BLOCK-----\nSuites: bookworm\nComponents: main\n",
			[]aptSource{{Types: []string{"deb"}, URIs: []string{"http://m/debian"}, Suites: []string{"bookworm"}, Components: []string{"main"}}}},
		{"stanza without URIs skipped", "Types: deb\nSuites: bookworm\n", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, parseDeb822Sources(tt.text)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestReadAptSources(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{
		"sources.list":                          "deb http://list/debian bookworm main\n",
		"sources.list.d/debian.sources":         hostLikeSources,
		"sources.list.d/extra.list":             "deb http://extra/debian bookworm-backports main\n",
		"sources.list.d/old.list.disabled":      "deb http://disabled/debian bookworm main\n",
		"sources.list.d/nodesource.sources.bak": "Types: deb\nURIs: http://bak/\nSuites: nodistro\n",
		"sources.list.d/.hidden.list":           "deb http://hidden/debian bookworm main\n",
	}
	for p, data := range files {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, p), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := readAptSources(dir)
	if err != nil {
		t.Fatal(err)
	}
	var uris []string
	for _, s := range got {
		uris = append(uris, s.URIs...)
	}
	want := []string{"http://list/debian", "http://deb.debian.org/debian", "http://deb.debian.org/debian-security", "http://extra/debian"}
	if diff := cmp.Diff(want, uris); diff != "" {
		t.Errorf("URIs read (-want +got):\n%s", diff)
	}

	// No sources at all is not an error here; debianMirrors reports it.
	if got, err := readAptSources(t.TempDir()); err != nil || len(got) != 0 {
		t.Errorf("empty apt dir: %v, %v", got, err)
	}
}

func TestDebianMirrors(t *testing.T) {
	deb := func(uri string, suites ...string) aptSource {
		return aptSource{Types: []string{"deb"}, URIs: []string{uri}, Suites: suites, Components: []string{"main"}}
	}
	tests := []struct {
		name    string
		sources []aptSource
		want    []string
		wantErr bool
	}{
		{"stock debian 12", parseDeb822Sources(hostLikeSources), []string{
			"deb http://deb.debian.org/debian bookworm main",
			"deb http://deb.debian.org/debian bookworm-updates main",
			"deb http://deb.debian.org/debian-security bookworm-security main",
		}, false},
		{"third-party repositories ignored, deb-src ignored", []aptSource{
			deb("https://deb.nodesource.com/node_20.x", "nodistro"),
			deb("https://packages.cloud.google.com/apt", "cloud-sdk-bookworm"),
			{Types: []string{"deb-src"}, URIs: []string{"http://src/debian"}, Suites: []string{"bookworm"}},
			deb("http://mirror.local/debian", "bookworm"),
		}, []string{
			"deb http://mirror.local/debian bookworm main",
			"deb http://mirror.local/debian bookworm-updates main",
		}, false},
		{"another release's mirror serves bookworm", []aptSource{
			deb("http://m/debian", "trixie", "trixie-updates"),
			deb("http://m/debian-security", "trixie-security"),
		}, []string{
			"deb http://m/debian bookworm main",
			"deb http://m/debian bookworm-updates main",
			"deb http://m/debian-security bookworm-security main",
		}, false},
		{"exact suite preferred over the first entry", []aptSource{
			deb("http://sid/debian", "sid"),
			deb("http://old-sec/debian-security", "buster/updates"),
			deb("http://bw/debian", "bookworm-backports"),
			deb("http://bw-sec/debian-security", "bookworm-security"),
		}, []string{
			"deb http://bw/debian bookworm main",
			"deb http://bw/debian bookworm-updates main",
			"deb http://bw-sec/debian-security bookworm-security main",
		}, false},
		{"no debian source", []aptSource{deb("https://deb.nodesource.com/node_20.x", "nodistro")}, nil, true},
		{"only security", []aptSource{deb("http://m/debian-security", "bookworm-security")}, nil, true},
		{"nothing", nil, nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := debianMirrors(tt.sources, "bookworm")
			if tt.wantErr {
				if !errors.Is(err, errdefs.ErrFailedPrecondition) {
					t.Fatalf("err = %v, want a failed precondition", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestEnsureBaseWithoutMmdebstrap(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	s, rec := newStore(t, "/bin/busybox")
	_, err := s.Ensure(t.Context(), "base")
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "apt-get install mmdebstrap") {
		t.Fatalf("err = %v, want a failed precondition naming the mmdebstrap package", err)
	}
	if list, _ := s.List(t.Context()); len(list) != 0 {
		t.Errorf("List after failure = %v", list)
	}
	if entries, _ := os.ReadDir(filepath.Join(s.dir, "base")); len(entries) != 0 {
		t.Errorf("failed build left %d entries", len(entries))
	}
	if rec.count("built template") != 0 {
		t.Error("reported a build")
	}
}

func TestScanLines(t *testing.T) {
	in := "I: one\r50%\r100%\ntwo\n\nlast"
	var got []string
	data := []byte(in)
	for len(data) > 0 {
		n, tok, err := scanLines(data, true)
		if err != nil || n == 0 {
			t.Fatalf("scanLines(%q) = %d, %v", data, n, err)
		}
		got = append(got, string(tok))
		data = data[n:]
	}
	if diff := cmp.Diff([]string{"I: one", "50%", "100%", "two", "", "last"}, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if n, _, _ := scanLines([]byte("partial"), false); n != 0 {
		t.Errorf("partial line consumed before EOF")
	}
}

// baseCacheDir keeps the base template between test runs: building it takes minutes, so a
// machine pays once and later runs reuse it while the recipe hash is unchanged. SPACE_TEMPLATES_DIR
// names another (a tree whose recipe differs would otherwise evict the machine's shared cache).
func baseCacheDir() string {
	if d := os.Getenv("SPACE_TEMPLATES_DIR"); d != "" {
		return d
	}
	return "/var/cache/space-test/templates"
}

func TestBuildBase(t *testing.T) {
	testutil.RequiresRoot(t)
	if _, err := exec.LookPath("mmdebstrap"); err != nil {
		t.Fatal("mmdebstrap missing: apt-get install mmdebstrap")
	}
	s, err := New(Config{Dir: baseCacheDir(), Logger: slog.New(slog.NewTextHandler(t.Output(), nil))})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	tmpl, err := s.Ensure(t.Context(), "base")
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	if tmpl.CreatedAt.After(start) {
		t.Logf("built base %s in %v: %d MiB of files", tmpl.Version, took.Round(time.Second), tmpl.SizeBytes>>20)
	} else {
		t.Logf("reused base %s built %v: %d MiB of files", tmpl.Version, tmpl.CreatedAt.Local().Format(time.DateTime), tmpl.SizeBytes>>20)
	}
	if want := must(s.version("base", s.recipes["base"])); tmpl.Version != want {
		t.Errorf("version %s, want %s", tmpl.Version, want)
	}
	root := tmpl.RootFS

	// Each check runs chrooted in a private mount and pid namespace with /proc and /dev/null,
	// which the sandbox runtime provides in real use; the mounts die with the namespace.
	const inChroot = `set -e; mount -t tmpfs -o mode=755 dev "$0/dev"; : > "$0/dev/null"; ` +
		`mount --bind /dev/null "$0/dev/null"; exec chroot "$0" "$@"`
	run := func(args ...string) (string, error) {
		cmd := exec.CommandContext(t.Context(), "unshare", append([]string{"--mount", "--propagation=private",
			"--pid", "--fork", "--mount-proc=" + filepath.Join(root, "proc"), "sh", "-c", inChroot, root}, args...)...)
		cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/tmp", "LANG=C.UTF-8"}
		out, err := cmd.CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	checks := []struct {
		args []string
		want string // a substring of the output
	}{
		{[]string{"python3", "-c", "import pandas, numpy, scipy, matplotlib, openpyxl; print('ok', numpy.__version__)"}, "ok "},
		{[]string{"node", "--version"}, "v"},
		{[]string{"npm", "--version"}, "."},
		{[]string{"pip", "--version"}, "python 3"},
		// venv seeds pip through ensurepip, which Debian disables without python3-venv. (A
		// real venv is made in a sandbox by e2e TestPipAndVenv: here it would land in the cache.)
		{[]string{"python3", "-m", "ensurepip", "--version"}, "pip "},
		// /etc/pip.conf lifts PEP 668's refusal of a plain `pip install`: pip goes on to look
		// for the package (in no index here).
		{[]string{"sh", "-c", "pip --no-cache-dir install --no-index space-no-such-package 2>&1; true"}, "No matching distribution"},
		{[]string{"git", "--version"}, "git version"},
		{[]string{"curl", "--version"}, "curl "},
		{[]string{"bash", "-c", "echo $BASH_VERSION"}, "."},
		{[]string{"ps", "--version"}, "procps"},
		{[]string{"getent", "passwd", "user"}, "user:x:1000:1000::/home/user:/bin/bash"},
		{[]string{"getent", "passwd", "root"}, ":/root:/bin/bash"},
		{[]string{"getent", "group", "user"}, "user:x:1000:"},
		{[]string{"locale", "-a"}, "C.utf8"},
	}
	for _, c := range checks {
		out, err := run(c.args...)
		if err != nil || !strings.Contains(out, c.want) {
			t.Errorf("%s: %q, %v; want output containing %q", strings.Join(c.args, " "), out, err, c.want)
		} else {
			t.Logf("%s: %s", c.args[0], firstLine(out))
		}
	}

	if st, err := os.Lstat(filepath.Join(root, ".space/space-agent")); err != nil || !st.Mode().IsRegular() || st.Size() != 0 {
		t.Errorf("/.space/space-agent must be an empty regular file (mount point): %v", err)
	}
	modes := map[string]os.FileMode{
		"tmp":       os.ModeDir | os.ModeSticky | 0o777,
		"home/user": os.ModeDir | 0o755,
		".space":    os.ModeDir | 0o755,
	}
	for p, want := range modes {
		if st, err := os.Lstat(filepath.Join(root, p)); err != nil || st.Mode() != want {
			t.Errorf("%s: mode %v (%v), want %v", p, st.Mode(), err, want)
		}
	}
	if st, err := os.Stat(filepath.Join(root, "home/user")); err == nil {
		if sys := st.Sys().(*syscall.Stat_t); sys.Uid != userUID || sys.Gid != userGID {
			t.Errorf("home/user owned by %d:%d, want 1000:1000", sys.Uid, sys.Gid)
		}
	}
	for p, want := range map[string]string{"etc/resolv.conf": "", "etc/hostname": "space\n"} {
		if b, err := os.ReadFile(filepath.Join(root, p)); err != nil || string(b) != want {
			t.Errorf("%s = %q, %v; want %q", p, b, err, want)
		}
	}
	// Lean: no documentation, man pages, translations, Boost headers or apt lists. (dpkg keeps
	// symbolic links, which cost nothing.)
	for _, glob := range []string{"usr/share/man/man1/*", "usr/share/doc/*/README*", "usr/share/locale/*/LC_MESSAGES/*",
		"usr/include/boost/*", "var/lib/apt/lists/*_*", "var/cache/apt/archives/*.deb"} {
		m, _ := filepath.Glob(filepath.Join(root, glob))
		m = slices.DeleteFunc(m, func(p string) bool {
			st, err := os.Lstat(p)
			return err == nil && st.Mode()&os.ModeSymlink != 0
		})
		if len(m) > 0 {
			t.Errorf("%d files match %s, e.g. %s", len(m), glob, m[0])
		}
	}
	if _, err := os.Stat(filepath.Join(root, "usr/share/doc/git/copyright")); err != nil {
		t.Errorf("licences must stay: %v", err)
	}
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

// leveled is a slog.Handler that keeps "LEVEL message" for each record.
type leveled struct{ got []string }

func (l *leveled) Enabled(context.Context, slog.Level) bool { return true }
func (l *leveled) Handle(_ context.Context, r slog.Record) error {
	l.got = append(l.got, r.Level.String()+" "+r.Message)
	return nil
}
func (l *leveled) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *leveled) WithGroup(string) slog.Handler      { return l }

func TestMmdebstrapProgress(t *testing.T) {
	h := &leveled{}
	s, err := New(Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	tr := s.track("base", "v1")
	defer tr.untrack()
	now := time.Unix(1000, 0)
	p := &mmdebstrapProgress{log: slog.New(h), t: tr, interval: 5 * time.Second, now: func() time.Time { return now }}
	steps := []struct {
		line    string
		advance time.Duration
	}{
		{"I: downloading packages with apt...", 0},
		{"0 upgraded, 3 newly installed, 0 to remove and 0 not upgraded.", 0},
		{"Get:1 http://deb.debian.org/debian bookworm/main amd64 libc6 amd64 2.36-9+deb12u10 [2757 kB]", time.Second},
		{"I: installing essential packages...", time.Second},
		{"Setting up libc6 (2.36-9+deb12u10) ...", 4 * time.Second}, // 6 s since start: a progress line
		{"I: installing remaining packages inside the chroot...", 0},
		{"0 upgraded, 2 newly installed, 0 to remove and 0 not upgraded.", time.Second},
		{"Unpacking git (1:2.39.5-0+deb12u2) ...", 0},
		{"Setting up git (1:2.39.5-0+deb12u2) ...", time.Second}, // 2 s since the last: none
		{"W: something odd", 0},
		{"E: it failed", 0},
		{"I:", 0},
		{"Setting up curl (7.88.1-10+deb12u12) ...", 3 * time.Second},
	}
	for _, st := range steps {
		now = now.Add(st.advance)
		p.line(t.Context(), st.line)
	}
	var infos []string
	for _, g := range h.got {
		if !strings.HasPrefix(g, "DEBUG ") {
			infos = append(infos, g)
		}
	}
	want := []string{
		"INFO mmdebstrap: I: downloading packages with apt...",
		"INFO mmdebstrap: I: installing essential packages...",
		"INFO mmdebstrap: installing essential packages: 1 of 3 packages set up",
		"INFO mmdebstrap: I: installing remaining packages inside the chroot...",
		"WARN mmdebstrap: W: something odd",
		"ERROR mmdebstrap: E: it failed",
		"INFO mmdebstrap: installing remaining packages inside the chroot: 3 of 5 packages set up",
	}
	if diff := cmp.Diff(want, infos); diff != "" {
		t.Errorf("log above debug (-want +got):\n%s", diff)
	}
	if n := len(h.got) - len(infos); n != 8 {
		t.Errorf("%d debug lines, want one per other line (8)", n)
	}
	got := s.Builds()
	if len(got) != 1 {
		t.Fatalf("Builds() = %+v, want one", got)
	}
	got[0].Started = time.Time{}
	wantP := Progress{Name: "base", Version: "v1", Step: "installing remaining packages inside the chroot",
		Done: 3, Total: 5, Line: "Setting up curl (7.88.1-10+deb12u12) ..."}
	if diff := cmp.Diff(wantP, got[0]); diff != "" {
		t.Errorf("progress (-want +got):\n%s", diff)
	}
}

func TestRunLoggedFailure(t *testing.T) {
	var lines []string
	err := runLogged(t.Context(), "sh", []string{"-c", "echo one; echo two >&2; printf 'three\\rfour'; exit 3"},
		func(l string) { lines = append(lines, l) })
	if diff := cmp.Diff([]string{"one", "two", "three", "four"}, lines); diff != "" {
		t.Errorf("lines (-want +got):\n%s", diff)
	}
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 3 || !strings.Contains(err.Error(), "two\nthree\nfour") {
		t.Errorf("err = %v, want exit status 3 with the last lines", err)
	}
	if err := runLogged(t.Context(), "true", nil, func(string) {}); err != nil {
		t.Errorf("true: %v", err)
	}
}
