package template

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/space-sandbox/space/internal/confine"
	"github.com/space-sandbox/space/internal/errdefs"
)

// baseVersion changes whenever buildBase makes a different tree from the same baseSpec (for
// example finishBase writes other files). Changes to baseSpec change the hash by themselves.
const baseVersion = 2

// baseSpec is everything that decides what the base template contains, apart from the mirror's
// current package versions. Its options are the recipe's hash input, so a template is rebuilt
// when the package list or an option changes, and not when the mirror publishes new versions of
// the same packages: to pick those up, bump baseVersion or delete <Dir>/base.
type baseSpec struct {
	suite    string   // Debian release, also the suite taken from the host's mirrors
	variant  string   // mmdebstrap --variant
	packages []string // installed on top of the variant, with their hard dependencies
	aptOpts  []string // mmdebstrap --aptopt
	dpkgOpts []string // mmdebstrap --dpkgopt; they stay in the rootfs for later installs
	hooks    []string // mmdebstrap --customize-hook shell commands; "$1" is the rootfs
}

// defaultBaseSpec is Debian bookworm minbase plus what a coding agent reaches for first: Python
// with the common data-science libraries, pip and venv (so that an agent can install more when
// its egress policy allows the package index), Node.js with npm, git and curl. Recommends are not
// installed (mmdebstrap's default) and documentation, man pages and translations are left out.
// The C.UTF-8 locale is part of libc-bin, so dropping /usr/share/locale keeps it.
func defaultBaseSpec() baseSpec {
	return baseSpec{
		suite:   "bookworm",
		variant: "minbase",
		packages: []string{
			"bash", "ca-certificates", "curl", "git", "procps",
			"python3", "python3-matplotlib", "python3-numpy", "python3-openpyxl", "python3-pandas", "python3-scipy",
			"python3-pip", "python3-venv",
			// The code-interpreter template's kernels (its server is a layer over base).
			"python3-ipykernel", "python3-jupyter-client",
			"nodejs", "npm",
		},
		aptOpts: []string{
			`Acquire::Languages "none"`,
			`Acquire::Retries "3"`,
		},
		dpkgOpts: []string{
			"path-exclude=/usr/share/doc/*",
			// Licences stay: they are small and redistributing a rootfs needs them.
			"path-include=/usr/share/doc/*/copyright",
			"path-exclude=/usr/share/man/*",
			"path-exclude=/usr/share/info/*",
			"path-exclude=/usr/share/locale/*",
			"path-include=/usr/share/locale/locale.alias",
			"path-exclude=/usr/share/lintian/*",
			"path-exclude=/usr/share/linda/*",
			// python3-scipy depends on pythran, which pulls in the Boost headers (140 MB) to
			// compile user code; no agent needs them to import scipy.
			"path-exclude=/usr/include/boost/*",
		},
		hooks: []string{
			fmt.Sprintf(`chroot "$1" useradd --uid %d --user-group --create-home --home-dir %s --shell /bin/bash user`, userUID, userHome),
			`chroot "$1" usermod --shell /bin/bash root`,
			// mmdebstrap's cleanup removes lists and archives too; this also drops what apt and
			// debconf keep beside them.
			`chroot "$1" apt-get clean`,
			`rm -f "$1"/var/lib/apt/lists/*_* "$1"/var/cache/apt/*.bin "$1"/var/cache/debconf/*-old "$1"/var/lib/dpkg/*-old`,
		},
	}
}

// options returns mmdebstrap's options for the spec, without the suite, target and mirrors. The
// package list is sorted, so only its content matters.
func (b baseSpec) options() []string {
	pkgs := slices.Clone(b.packages)
	slices.Sort(pkgs)
	opts := []string{
		// unshare mode run as root keeps ownership exact and mounts /proc, /sys and /dev of the
		// chroot in a private mount namespace, which dies with mmdebstrap: nothing of the build
		// stays mounted on the host, whatever happens to it.
		"--mode=unshare",
		"--format=directory",
		"--variant=" + b.variant,
		"--include=" + strings.Join(pkgs, ","),
	}
	for _, o := range b.aptOpts {
		opts = append(opts, "--aptopt="+o)
	}
	for _, o := range b.dpkgOpts {
		opts = append(opts, "--dpkgopt="+o)
	}
	for _, h := range b.hooks {
		opts = append(opts, "--customize-hook="+h)
	}
	return opts
}

// inputs is the recipe's hash input: suite and options. The mirrors are left out on purpose: the
// same packages from another mirror make the same template.
func (b baseSpec) inputs() []byte {
	return []byte("suite " + b.suite + "\x00" + strings.Join(b.options(), "\x00"))
}

// baseRecipe builds the base template with mmdebstrap from the Debian mirrors that the host's apt
// uses, as found in aptDir (normally /etc/apt). It needs root and the mmdebstrap package.
func baseRecipe(aptDir string) recipe {
	return baseRecipeFrom(defaultBaseSpec(), aptDir)
}

func baseRecipeFrom(spec baseSpec, aptDir string) recipe {
	return recipe{
		version: baseVersion,
		inputs:  func(*Store) ([]byte, error) { return spec.inputs(), nil },
		build: func(ctx context.Context, s *Store, rootfs string) error {
			return buildBase(ctx, s, spec, aptDir, rootfs)
		},
	}
}

func buildBase(ctx context.Context, s *Store, spec baseSpec, aptDir, rootfs string) error {
	mmdebstrap, err := exec.LookPath("mmdebstrap")
	if err != nil {
		return fmt.Errorf("mmdebstrap not found; install Debian's mmdebstrap package (apt-get install mmdebstrap): %w",
			errdefs.ErrFailedPrecondition)
	}
	if os.Geteuid() != 0 {
		return fmt.Errorf("building the base template needs root: %w", errdefs.ErrFailedPrecondition)
	}
	sources, err := readAptSources(aptDir)
	if err != nil {
		return fmt.Errorf("read the host's apt sources: %w", err)
	}
	mirrors, err := debianMirrors(sources, spec.suite)
	if err != nil {
		return fmt.Errorf("%w (looked in %s)", err, aptDir)
	}
	// --verbose only changes what is printed, so it is not part of the recipe's hash: without it,
	// installing several hundred packages is minutes of silence.
	args := append([]string{"--verbose"}, spec.options()...)
	args = append(args, spec.suite, rootfs)
	args = append(args, mirrors...)
	s.log.InfoContext(ctx, "running mmdebstrap (takes minutes)", "template", "base", "mirrors", strings.Join(mirrors, "; "))
	p := &mmdebstrapProgress{log: s.log, t: trackerFrom(ctx, s)}
	if err := runLogged(ctx, mmdebstrap, args, func(line string) { p.line(ctx, line) }); err != nil {
		return err
	}
	return finishBase(s, rootfs)
}

// runLogged runs a command and hands each line it writes to logLine as it comes. The error of a
// failed command carries its last lines. The command runs in a process group of its own; when
// ctx ends, the whole group gets SIGTERM and, killGrace later, SIGKILL, so that nothing the
// command started (apt, dpkg, maintainer scripts) outlives it, and runLogged returns soon after.
func runLogged(ctx context.Context, name string, args []string, logLine func(string)) error {
	const killGrace = 500 * time.Millisecond
	cmd := exec.Command(name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Start(); err != nil {
		r.Close()
		w.Close()
		return fmt.Errorf("start %s: %w", name, err)
	}
	w.Close()
	pgid := cmd.Process.Pid
	// The group outlives its leader while members live, so its ID is not reused while there is
	// anything to kill; once reading ends (every writer gone) and the leader is reaped, stop.
	var mu sync.Mutex
	finished := false
	killGroup := func(sig syscall.Signal) {
		mu.Lock()
		defer mu.Unlock()
		if !finished {
			syscall.Kill(-pgid, sig)
		}
	}
	stop := context.AfterFunc(ctx, func() {
		killGroup(syscall.SIGTERM)
		time.AfterFunc(killGrace, func() { killGroup(syscall.SIGKILL) })
		// A process that left the group could keep the pipe open: stop reading regardless.
		r.SetReadDeadline(time.Now().Add(2 * killGrace))
	})
	const keep = 15
	var tail []string
	sc := bufio.NewScanner(r)
	sc.Split(scanLines)
	for sc.Scan() {
		line := strings.TrimRight(sc.Text(), " \t")
		if line == "" {
			continue
		}
		logLine(line)
		if tail = append(tail, line); len(tail) > keep {
			tail = tail[1:]
		}
	}
	if err := sc.Err(); err != nil && ctx.Err() == nil {
		// Keep draining so the command never blocks on a full pipe.
		io.Copy(io.Discard, r)
	}
	r.Close()
	werr := cmd.Wait()
	mu.Lock()
	finished = true
	mu.Unlock()
	stop()
	if ctx.Err() != nil {
		return fmt.Errorf("%s: %w", filepath.Base(name), context.Cause(ctx))
	}
	if werr != nil {
		return fmt.Errorf("%s: %w; last output:\n%s", filepath.Base(name), werr, strings.Join(tail, "\n"))
	}
	return nil
}

// scanLines splits at \n and at \r, so that progress bars redrawn in place give lines too.
func scanLines(data []byte, atEOF bool) (int, []byte, error) {
	if i := strings.IndexAny(string(data), "\r\n"); i >= 0 {
		return i + 1, data[:i], nil
	}
	if atEOF && len(data) > 0 {
		return len(data), data, nil
	}
	if len(data) >= 64*1024 {
		return len(data), data, nil // a very long line, in pieces
	}
	return 0, nil, nil
}

// finishBase writes the files that make the tree a SPACE template, through confine: whatever a
// package left at those paths (a link, say) is replaced, never written through.
func finishBase(s *Store, rootfs string) error {
	files := []struct {
		path string
		mode uint32
		data string
	}{
		{"etc/hostname", 0o644, "space\n"},
		{"etc/hosts", 0o644, "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"},
		// mmdebstrap copied the host's; the network layer decides where a sandbox resolves names.
		{"etc/resolv.conf", 0o644, ""},
		// The agent's mount point: drivers bind-mount the agent here.
		{".space/space-agent", 0o755, ""},
		// Debian marks its Python as externally managed (PEP 668), so a plain `pip install`
		// refuses; in a sandbox nobody else manages it. As user, pip then installs to ~/.local.
		{"etc/pip.conf", 0o644, "[global]\nbreak-system-packages = true\n"},
	}
	root, err := confine.Open(rootfs)
	if err != nil {
		return err
	}
	defer root.Close()
	if err := root.EnsureDir(".space", 0o755); err != nil {
		return err
	}
	if err := root.EnsureDir("tmp", 0o1777); err != nil {
		return err
	}
	if err := root.SetMeta("tmp", confine.Meta{Mode: 0o1777, MTime: time.Now().UnixNano()}); err != nil {
		return err
	}
	for _, f := range files {
		if err := root.WriteFile(f.path, []byte(f.data), f.mode); err != nil {
			return fmt.Errorf("write %s: %w", f.path, err)
		}
		if err := root.SetMeta(f.path, confine.Meta{Mode: f.mode, MTime: time.Now().UnixNano()}); err != nil {
			return fmt.Errorf("write %s: %w", f.path, err)
		}
	}
	// useradd in the customize hook made the home directory; check, since the agent relies on it.
	if st, err := root.Lstat(strings.TrimPrefix(userHome, "/")); err != nil || !st.IsDir() {
		return fmt.Errorf("base template has no home directory %s for user (%v)", userHome, err)
	}
	s.log.Debug("finished base tree", "rootfs", rootfs)
	return nil
}

// aptSource is one entry of an apt sources list, in either format.
type aptSource struct {
	Types      []string // deb, deb-src
	URIs       []string
	Suites     []string
	Components []string
}

// readAptSources reads aptDir/sources.list and the *.list and *.sources files of
// aptDir/sources.list.d, as apt does (other names, such as *.disabled, are ignored).
func readAptSources(aptDir string) ([]aptSource, error) {
	var out []aptSource
	main := filepath.Join(aptDir, "sources.list")
	//confine:host the host's own apt configuration
	b, err := os.ReadFile(main)
	switch {
	case err == nil:
		out = append(out, parseOneLineSources(string(b))...)
	case !errors.Is(err, fs.ErrNotExist):
		return nil, err
	}
	//confine:host the host's own apt configuration
	entries, err := os.ReadDir(filepath.Join(aptDir, "sources.list.d"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".") {
			continue
		}
		deb822 := strings.HasSuffix(name, ".sources")
		if !deb822 && !strings.HasSuffix(name, ".list") {
			continue
		}
		//confine:host the host's own apt configuration
		b, err := os.ReadFile(filepath.Join(aptDir, "sources.list.d", name))
		if err != nil {
			return nil, err
		}
		if deb822 {
			out = append(out, parseDeb822Sources(string(b))...)
		} else {
			out = append(out, parseOneLineSources(string(b))...)
		}
	}
	return out, nil
}

// parseOneLineSources parses the classic format: "deb [opt=val ...] uri suite [component ...]".
// Malformed lines are skipped, as apt would refuse them anyway.
func parseOneLineSources(text string) []aptSource {
	var out []aptSource
	for line := range strings.Lines(text) {
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		typ, rest := f[0], f[1:]
		if len(rest) > 0 && strings.HasPrefix(rest[0], "[") {
			// Options run to the field that ends with "]", which may be the first.
			end := slices.IndexFunc(rest, func(s string) bool { return strings.HasSuffix(s, "]") })
			if end < 0 {
				continue
			}
			rest = rest[end+1:]
		}
		if len(rest) < 2 {
			continue
		}
		out = append(out, aptSource{Types: []string{typ}, URIs: rest[:1], Suites: rest[1:2], Components: rest[2:]})
	}
	return out
}

// parseDeb822Sources parses the deb822 format of *.sources files: stanzas of "Field: value"
// separated by blank lines, continuation lines starting with white space, "#" comment lines.
// Stanzas with "Enabled: no" are skipped.
func parseDeb822Sources(text string) []aptSource {
	var out []aptSource
	fields := map[string]string{}
	last := ""
	flush := func() {
		if len(fields) > 0 && !strings.EqualFold(fields["enabled"], "no") {
			src := aptSource{
				Types:      strings.Fields(fields["types"]),
				URIs:       strings.Fields(fields["uris"]),
				Suites:     strings.Fields(fields["suites"]),
				Components: strings.Fields(fields["components"]),
			}
			if len(src.Types) > 0 && len(src.URIs) > 0 && len(src.Suites) > 0 {
				out = append(out, src)
			}
		}
		fields, last = map[string]string{}, ""
	}
	for line := range strings.Lines(text) {
		line = strings.TrimRight(line, "\r\n")
		switch {
		case strings.HasPrefix(line, "#"):
		case strings.TrimSpace(line) == "":
			flush()
		case line[0] == ' ' || line[0] == '\t':
			if last != "" {
				fields[last] += "\n" + strings.TrimSpace(line)
			}
		default:
			k, v, ok := strings.Cut(line, ":")
			if !ok {
				continue
			}
			last = strings.ToLower(strings.TrimSpace(k))
			fields[last] = strings.TrimSpace(v)
		}
	}
	flush()
	return out
}

// debianMirrors picks the Debian archive and security mirrors from the host's sources, preferring
// entries for suite itself, and returns mmdebstrap mirror lines for suite, its updates and its
// security updates (main only). A host without a security mirror gets no security line.
func debianMirrors(sources []aptSource, suite string) ([]string, error) {
	// Suite names, without -updates or -security, that mark a source as a Debian archive rather
	// than a third-party repository.
	debianReleases := []string{
		"buster", "bullseye", "bookworm", "trixie", "forky", "duke", "sid",
		"oldoldstable", "oldstable", "stable", "testing", "unstable",
	}
	var archive, security, anyArchive, anySecurity string
	for _, src := range sources {
		if !slices.Contains(src.Types, "deb") {
			continue
		}
		for _, uri := range src.URIs {
			for _, su := range src.Suites {
				release, sec := splitSuite(su)
				if !slices.Contains(debianReleases, release) {
					continue
				}
				exact := release == suite
				switch {
				case sec && exact && security == "":
					security = uri
				case sec && anySecurity == "":
					anySecurity = uri
				case !sec && exact && archive == "":
					archive = uri
				case !sec && anyArchive == "":
					anyArchive = uri
				}
			}
		}
	}
	if archive == "" {
		archive = anyArchive
	}
	if security == "" {
		security = anySecurity
	}
	if archive == "" {
		return nil, fmt.Errorf("the host's apt has no Debian mirror (no deb entry for a Debian suite): %w",
			errdefs.ErrFailedPrecondition)
	}
	lines := []string{
		"deb " + archive + " " + suite + " main",
		"deb " + archive + " " + suite + "-updates main",
	}
	if security != "" {
		lines = append(lines, "deb "+security+" "+suite+"-security main")
	}
	return lines, nil
}

// splitSuite returns the release of a suite name ("bookworm" for "bookworm-updates") and whether
// it is a security suite ("bookworm-security", or "buster/updates" before bullseye).
func splitSuite(suite string) (release string, security bool) {
	suite = strings.TrimSuffix(suite, "/")
	if r, ok := strings.CutSuffix(suite, "-security"); ok {
		return r, true
	}
	if r, ok := strings.CutSuffix(suite, "/updates"); ok {
		return r, true
	}
	for _, sfx := range []string{"-updates", "-backports", "-proposed-updates", "-backports-sloppy"} {
		if r, ok := strings.CutSuffix(suite, sfx); ok {
			return r, false
		}
	}
	return suite, false
}
