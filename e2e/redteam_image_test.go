package e2e

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/space-sandbox/space/internal/spacedtest"
	"github.com/space-sandbox/space/pkg/client"
)

// imgEntry is one entry of a hostile layer.
type imgEntry struct {
	hdr  tar.Header
	body string
}

func reg(name, body string) imgEntry {
	return imgEntry{hdr: tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644}, body: body}
}
func sym(name, target string) imgEntry {
	return imgEntry{hdr: tar.Header{Name: name, Typeflag: tar.TypeSymlink, Linkname: target, Mode: 0o777}}
}
func dirE(name string, mode int64) imgEntry {
	return imgEntry{hdr: tar.Header{Name: name, Typeflag: tar.TypeDir, Mode: mode}}
}

// imgTrap is a hostile image: its layer entries and what must not happen because of them.
type imgTrap struct {
	name    string
	entries func(fmtName string) []imgEntry
	noTmp   bool     // the trap replaces /tmp
	read    []string // paths downloaded from a sandbox of the image
	readsFn func(fmtName string) []string
	needles []string
	host    []string // entries of the test's host directory that must not change
	files   []string // base names that must not materialise as special files (template trees included)
	flags   []string // mount options a sandbox of the image must have
	after   func(ctx context.Context, c *client.Client, id, fmtName string) string
	quick   string // the format it runs in within the quick subset
}

func rtImage(t *testing.T, entries []imgEntry, noTmp bool) v1.Image {
	t.Helper()
	base := []imgEntry{dirE("etc/", 0o755), dirE("root/", 0o700), reg("etc/passwd", "root:x:0:0:root:/root:/bin/sh\n")}
	if !noTmp {
		base = append(base, dirE("tmp/", 0o1777))
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range append(base, entries...) {
		h := e.hdr
		h.Size = int64(len(e.body))
		h.Format = tar.FormatPAX
		if h.ModTime.IsZero() {
			h.ModTime = time.Unix(1700000000, 0)
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatalf("%s: %v", h.Name, err)
		}
		io.WriteString(tw, e.body)
	}
	tw.Close()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf.Bytes())), nil })
	if err != nil {
		t.Fatal(err)
	}
	return withConfig(t, layer)
}

func withConfig(t *testing.T, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config.Env = []string{"PATH=/bin"}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// writeImage stores img as a docker-archive file or an OCI layout under dir and returns the
// from.image reference naming it.
func writeImage(t *testing.T, img v1.Image, format, dir string) string {
	t.Helper()
	p := filepath.Join(dir, "img-"+spacedtest.RandomHex(4))
	switch format {
	case "docker-archive":
		p += ".tar"
		if err := tarball.WriteToFile(p, name.MustParseReference("redteam/img:1"), img); err != nil {
			t.Fatal(err)
		}
	case "oci":
		lp, err := layout.Write(p, empty.Index)
		if err != nil {
			t.Fatal(err)
		}
		if err := lp.AppendImage(img); err != nil {
			t.Fatal(err)
		}
	}
	return format + ":" + p
}

func (rt *redTeam) imageTraps(t *testing.T, home string) []imgTrap {
	H := rt.host
	up := strings.TrimSuffix(strings.Repeat("../", 12), "/")
	cn := func(n string) string { return rt.canary(t, n, 0) }
	bundle := "etc/ssl/certs/ca-certificates.crt"
	ca := func(trap, target string, needles ...string) imgTrap {
		return imgTrap{name: trap, read: []string{"/etc/space/ca-bundle.crt", "/" + bundle}, needles: needles,
			entries: func(string) []imgEntry {
				return []imgEntry{dirE("etc/ssl/", 0o755), dirE("etc/ssl/certs/", 0o755), sym(bundle, target)}
			}}
	}
	perFmt := func(_ string, f func(fmtName string)) {
		for _, fm := range []string{"docker-archive", "oci"} {
			f(fm)
		}
	}
	// Canaries and host targets, one per format so that each import has its own.
	for _, base := range []string{"I-ca-abs", "I-ca-rel", "I-root", "I-rel", "I-hl", "I-hl2", "I-resolv", "I-oracle"} {
		perFmt(base, func(f string) { cn(base + "-" + f) })
	}
	for _, base := range []string{"I-ssldir", "I-tmp", "I-tmprel", "I-hostdir", "I-etcspace", "I-dotspace"} {
		perFmt(base, func(f string) {
			if base == "I-ssldir" {
				cn(base + "-" + f + "/certs/ca-certificates.crt")
			} else {
				cn(base + "-" + f + "/f")
			}
		})
	}
	for _, base := range []string{"I-through", "I-wh", "I-opq"} {
		perFmt(base, func(f string) {
			os.MkdirAll(filepath.Join(H, base+"-"+f), 0o755)
			os.WriteFile(filepath.Join(H, base+"-"+f, "victim"), []byte("keep\n"), 0o644)
		})
	}
	h := func(n, f string) string { return filepath.Join(H, n+"-"+f) }
	restoreThrough := func(link, canary string) func(ctx context.Context, c *client.Client, id, f string) string {
		return func(ctx context.Context, c *client.Client, id, f string) string {
			s, err := c.CreateSnapshot(ctx, id, client.SnapshotFilesystem, "")
			if err != nil {
				return ""
			}
			p := "/" + link + h(canary, f)
			if link == "hostdir" {
				p = "/hostdir"
			}
			c.Restore(ctx, id, s.ID, p)
			return ""
		}
	}
	traps := []imgTrap{
		withNeedle(ca("ca-bundle-symlink-abs", ""), "I-ca-abs"),
		withNeedle(ca("ca-bundle-symlink-rel", ""), "I-ca-rel"),
		ca("ca-bundle-symlink-procself-environ", "/proc/self/environ", "environ", "admin-key-env"),
		ca("ca-bundle-symlink-admin.key", filepath.Join(home, "admin.key"), "admin.key"),
		ca("ca-bundle-symlink-secrets.key", filepath.Join(home, "secrets.key"), "secrets.key"),
		ca("ca-bundle-symlink-egress-ca.key", filepath.Join(home, "egress-ca.key"), "egress-ca.key"),
		{name: "ca-bundle-symlinked-ssl-dir", read: []string{"/etc/space/ca-bundle.crt"}},
		{name: "tmp-symlink-abs", noTmp: true, read: []string{"/tmp/f"}},
		{name: "tmp-symlink-rel", noTmp: true, read: []string{"/tmp/f"}},
		{name: "resolv.conf-symlink", read: []string{"/etc/resolv.conf"}},
		{name: "etc-space-symlink", read: []string{"/etc/space/f"}},
		{name: "agent-dir-symlink", read: []string{"/.space/f"}},
		{name: "restore-paths-through-link-to-root", read: []string{"/hostroot"}},
		{name: "restore-paths-through-relative-link", read: []string{"/hostrel"}},
		{name: "restore-paths-of-link-to-host-dir", read: []string{"/hostdir/f"}},
		{name: "diff-existence-oracle-through-link"},
		{name: "tar-name-dotdot"},
		{name: "tar-name-absolute"},
		{name: "tar-write-through-symlink"},
		{name: "tar-hardlink-absolute", read: []string{"/hl"}},
		{name: "tar-hardlink-through-symlink", read: []string{"/hl2"}},
		{name: "tar-device-nodes", files: []string{"devmem", "devdisk"}},
		{name: "tar-setuid-root-file", flags: []string{"nosuid"}},
		{name: "tar-fifo", files: []string{"fifo-rt"}},
		{name: "tar-whiteout-dotdot"},
		{name: "tar-whiteout-through-symlink"},
		{name: "tar-opaque-whiteout-through-symlink"},
	}
	for i := range traps {
		tr := &traps[i]
		switch tr.name {
		case "ca-bundle-symlink-abs":
			tr.entries = func(f string) []imgEntry {
				return []imgEntry{dirE("etc/ssl/", 0o755), dirE("etc/ssl/certs/", 0o755), sym(bundle, h("I-ca-abs", f))}
			}
			tr.quick = "docker-archive"
		case "ca-bundle-symlink-rel":
			tr.entries = func(f string) []imgEntry {
				return []imgEntry{dirE("etc/ssl/", 0o755), dirE("etc/ssl/certs/", 0o755), sym(bundle, up+h("I-ca-rel", f))}
			}
		case "ca-bundle-symlinked-ssl-dir":
			tr.entries = func(f string) []imgEntry { return []imgEntry{sym("etc/ssl", h("I-ssldir", f))} }
			tr.needles = []string{"I-ssldir-*/certs/ca-certificates.crt"}
		case "tmp-symlink-abs":
			tr.entries = func(f string) []imgEntry { return []imgEntry{sym("tmp", h("I-tmp", f))} }
			tr.needles, tr.host, tr.quick = []string{"I-tmp-*/f"}, []string{"I-tmp-*"}, "oci"
			tr.after = uploadTmp
		case "tmp-symlink-rel":
			tr.entries = func(f string) []imgEntry { return []imgEntry{sym("tmp", up+h("I-tmprel", f))} }
			tr.needles, tr.host = []string{"I-tmprel-*/f"}, []string{"I-tmprel-*"}
			tr.after = uploadTmp
		case "resolv.conf-symlink":
			tr.entries = func(f string) []imgEntry { return []imgEntry{sym("etc/resolv.conf", h("I-resolv", f))} }
			tr.needles, tr.host = []string{"I-resolv-*"}, []string{"I-resolv-*"}
		case "etc-space-symlink":
			tr.entries = func(f string) []imgEntry { return []imgEntry{sym("etc/space", h("I-etcspace", f))} }
			tr.needles, tr.host = []string{"I-etcspace-*/f"}, []string{"I-etcspace-*"}
		case "agent-dir-symlink":
			tr.entries = func(f string) []imgEntry { return []imgEntry{sym(".space", h("I-dotspace", f))} }
			tr.needles, tr.host = []string{"I-dotspace-*/f"}, []string{"I-dotspace-*"}
		case "restore-paths-through-link-to-root":
			tr.entries = func(string) []imgEntry { return []imgEntry{sym("hostroot", "/")} }
			tr.needles, tr.after, tr.quick = []string{"I-root-*"}, restoreThrough("hostroot", "I-root"), "docker-archive"
			tr.read, tr.readsFn = nil, func(f string) []string { return []string{"/hostroot" + h("I-root", f)} }
		case "restore-paths-through-relative-link":
			tr.entries = func(string) []imgEntry { return []imgEntry{sym("hostrel", up)} }
			tr.needles, tr.after = []string{"I-rel-*"}, restoreThrough("hostrel", "I-rel")
			tr.read, tr.readsFn = nil, func(f string) []string { return []string{"/hostrel" + h("I-rel", f)} }
		case "restore-paths-of-link-to-host-dir":
			tr.entries = func(f string) []imgEntry { return []imgEntry{sym("hostdir", h("I-hostdir", f))} }
			tr.needles, tr.after = []string{"I-hostdir-*/f"}, restoreThrough("hostdir", "")
		case "diff-existence-oracle-through-link":
			tr.entries = func(string) []imgEntry { return []imgEntry{sym("hostroot", "/")} }
			tr.after = func(ctx context.Context, c *client.Client, id, f string) string {
				s1, err := c.CreateSnapshot(ctx, id, client.SnapshotFilesystem, "")
				if err != nil {
					return ""
				}
				c.Remove(ctx, id, "/hostroot", false)
				canary, control := "/hostroot"+h("I-oracle", f), "/hostroot"+h("I-oracle-control-absent", f)
				c.Upload(ctx, id, canary, strings.NewReader("x"), nil)
				c.Upload(ctx, id, control, strings.NewReader("x"), nil)
				s2, err := c.CreateSnapshot(ctx, id, client.SnapshotFilesystem, "")
				if err != nil {
					return ""
				}
				changes, _ := c.Diff(ctx, s2.ID, s1.ID)
				return oracleEvidence(changes, canary, control)
			}
		case "tar-name-dotdot":
			tr.entries = func(f string) []imgEntry { return []imgEntry{reg(up+h("I-dotdot", f), "x")} }
			tr.host, tr.quick = []string{"I-dotdot-*"}, "docker-archive"
		case "tar-name-absolute":
			tr.entries = func(f string) []imgEntry { return []imgEntry{reg(h("I-abs", f), "x")} }
			tr.host = []string{"I-abs-*"}
		case "tar-write-through-symlink":
			tr.entries = func(f string) []imgEntry { return []imgEntry{sym("esc", h("I-through", f)), reg("esc/written", "x")} }
			tr.host = []string{"I-through-*"}
		case "tar-hardlink-absolute":
			tr.entries = func(f string) []imgEntry {
				return []imgEntry{{hdr: tar.Header{Name: "hl", Typeflag: tar.TypeLink, Linkname: h("I-hl", f)}}}
			}
			tr.needles, tr.host = []string{"I-hl-*"}, []string{"I-hl-*"}
		case "tar-hardlink-through-symlink":
			tr.entries = func(f string) []imgEntry {
				return []imgEntry{sym("esc2", H), {hdr: tar.Header{Name: "hl2", Typeflag: tar.TypeLink, Linkname: "esc2/" + filepath.Base(h("I-hl2", f))}}}
			}
			tr.needles, tr.host = []string{"I-hl2-*"}, []string{"I-hl2-*"}
		case "tar-device-nodes":
			tr.entries = func(string) []imgEntry {
				return []imgEntry{{hdr: tar.Header{Name: "devmem", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 1, Mode: 0o666}},
					{hdr: tar.Header{Name: "devdisk", Typeflag: tar.TypeBlock, Devmajor: 254, Devminor: 0, Mode: 0o666}}}
			}
		case "tar-setuid-root-file":
			tr.entries = func(string) []imgEntry {
				return []imgEntry{{hdr: tar.Header{Name: "suid", Typeflag: tar.TypeReg, Mode: 0o4755}, body: "#!/bin/sh\n"}}
			}
		case "tar-fifo":
			tr.entries = func(string) []imgEntry {
				return []imgEntry{{hdr: tar.Header{Name: "fifo-rt", Typeflag: tar.TypeFifo, Mode: 0o644}}}
			}
		case "tar-whiteout-dotdot":
			tr.entries = func(string) []imgEntry { return []imgEntry{reg("etc/.wh...", "")} }
		case "tar-whiteout-through-symlink":
			tr.entries = func(f string) []imgEntry { return []imgEntry{sym("wl", h("I-wh", f)), reg("wl/.wh.victim", "")} }
			tr.host = []string{"I-wh-*"}
		case "tar-opaque-whiteout-through-symlink":
			tr.entries = func(f string) []imgEntry { return []imgEntry{sym("ol", h("I-opq", f)), reg("ol/.wh..wh..opq", "")} }
			tr.host = []string{"I-opq-*"}
		}
	}
	return traps
}

func withNeedle(tr imgTrap, n string) imgTrap {
	tr.needles = []string{n + "-*"}
	return tr
}

func uploadTmp(ctx context.Context, c *client.Client, id, _ string) string {
	c.Upload(ctx, id, "/tmp/rt-written", strings.NewReader("written by the sandbox\n"), nil)
	return ""
}

// forFormat turns "X-*" patterns into X-<format>.
func forFormat(l []string, f string) []string {
	var out []string
	for _, s := range l {
		out = append(out, strings.ReplaceAll(s, "*", f))
	}
	return out
}

func (rt *redTeam) imagesGroup(t *testing.T) {
	d := rt.rtDaemon(t)
	home := d.Opts.Home
	imgDir := t.TempDir()
	traps := rt.imageTraps(t, home)
	for _, format := range []string{"docker-archive", "oci"} {
		t.Run(format, func(t *testing.T) {
			t.Parallel()
			for _, tr := range traps {
				if !rt.full && tr.quick != format {
					continue
				}
				rt.imageAttempt(t, d, tr, format, imgDir)
			}
			if rt.full || format == "docker-archive" {
				rt.hostPathDisclosure(t, d, format, imgDir)
			}
		})
	}
	if rt.full {
		t.Run("zero-bomb", func(t *testing.T) { rt.zeroBomb(t, d, imgDir) })
	}
}

func (rt *redTeam) imageAttempt(t *testing.T, d *spacedtest.Daemon, tr imgTrap, format, imgDir string) {
	c, home := d.Client, d.Opts.Home
	ref := writeImage(t, rtImage(t, tr.entries(format), tr.noTmp), format, imgDir)
	needles := forFormat(tr.needles, format)
	hostTargets := forFormat(tr.host, format)
	beforeScan := rt.scanHome(home)
	beforeSpecial := toSet(specialFiles(home, nil))
	beforeHost := treeDigest(rt.host)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tname := "rt-img-" + spacedtest.RandomHex(4)
	var log []string
	_, err := c.BuildTemplate(ctx, client.BuildTemplateRequest{Name: tname, From: client.BuildFrom{Image: ref}}, func(l string) { log = append(log, l) })
	var id string
	var ev []string
	if err == nil {
		defer c.DeleteTemplate(context.Background(), tname)
		var sb *client.Sandbox
		if sb, err = c.CreateSandbox(ctx, client.CreateSandboxRequest{Template: tname}); err == nil {
			id = sb.ID
			defer c.DeleteSandbox(context.Background(), id)
		}
	}
	failure, note := opFailure(err)
	if id != "" {
		if tr.after != nil {
			if e := tr.after(ctx, c, id, format); e != "" {
				ev = append(ev, e)
			}
		}
		reads := tr.read
		if tr.readsFn != nil {
			reads = append(reads, tr.readsFn(format)...)
		}
		var got []byte
		for _, p := range reads {
			if r, err := c.Download(ctx, id, p); err == nil {
				b, _ := io.ReadAll(io.LimitReader(r, 1<<20))
				r.Close()
				got = append(got, b...)
			}
		}
		for _, n := range rt.found(got, needles...) {
			ev = append(ev, "canary "+n+" inside the sandbox")
		}
		if len(tr.flags) > 0 {
			if m := missingMountFlags(home, id, tr.flags...); m != "" {
				ev = append(ev, m+" (the image holds a setuid-root file)")
			}
		}
		if failure == "" {
			failure = healthy(c, id)
		}
	}
	for _, n := range rt.found([]byte(strings.Join(log, "\n")), needles...) {
		ev = append(ev, "canary "+n+" in the build log")
	}
	scan := rt.scanHome(home)
	for _, n := range needles {
		for _, p := range scan[n] {
			if !slices.Contains(beforeScan[n], p) {
				ev = append(ev, "canary "+n+" in host file "+p)
			}
		}
	}
	for _, ch := range digestChanges(beforeHost, treeDigest(rt.host)) {
		f := strings.Fields(ch)
		for _, h := range hostTargets {
			if len(f) == 2 && (f[1] == h || strings.HasPrefix(f[1], h+"/")) {
				ev = append(ev, "host "+ch)
			}
		}
	}
	for _, s := range specialFiles(home, nil) {
		if !beforeSpecial[s] {
			f := strings.Fields(s)
			if slices.Contains(tr.files, filepath.Base(f[len(f)-1])) {
				ev = append(ev, "materialised on the host: "+s)
			}
		}
	}
	rt.judge(t, "images/"+format, tr.name, trimTo(strings.Join(ev, "; "), 600), failure, note)
}

// hostPathDisclosure: a tenant lists templates; no host path (of the archive the admin built
// from) may be in the answer.
func (rt *redTeam) hostPathDisclosure(t *testing.T, d *spacedtest.Daemon, format, imgDir string) {
	c := d.Client
	ctx := ctxT(t)
	ref := writeImage(t, rtImage(t, nil, false), format, imgDir)
	tname := "rt-src-" + spacedtest.RandomHex(4)
	_, err := c.BuildTemplate(ctx, client.BuildTemplateRequest{Name: tname, From: client.BuildFrom{Image: ref}}, nil)
	if err != nil {
		rt.judge(t, "images/"+format, "tenant-sees-host-path-of-image-source", "", "build: "+err.Error(), "")
		return
	}
	defer c.DeleteTemplate(context.Background(), tname)
	key, err := c.CreateKey(ctx, "rt-tenant-"+spacedtest.RandomHex(3))
	if err != nil {
		t.Fatal(err)
	}
	tenant, _ := client.New(d.URL, key.Key)
	list, err := tenant.ListTemplates(ctx)
	failure, note := opFailure(err)
	var ev string
	for _, tp := range list {
		if strings.Contains(tp.Parent, imgDir) || strings.Contains(tp.Name, imgDir) {
			ev = fmt.Sprintf("a tenant's template list shows template %s with parent %q", tp.Name, tp.Parent)
		}
	}
	rt.judge(t, "images/"+format, "tenant-sees-host-path-of-image-source", ev, failure, note)
}

// zeroBomb: a small compressed layer that unpacks to 1 GiB of zeros must not take 1 GiB of host
// disk (holes are written as holes, or the size is capped and the import refused).
func (rt *redTeam) zeroBomb(t *testing.T, d *spacedtest.Daemon, imgDir string) {
	c, home := d.Client, d.Opts.Home
	const size = 1 << 30
	gz := filepath.Join(imgDir, "zero.tar.gz")
	f, err := os.Create(gz)
	if err != nil {
		t.Fatal(err)
	}
	zw, _ := gzip.NewWriterLevel(f, gzip.BestSpeed)
	tw := tar.NewWriter(zw)
	for _, e := range []imgEntry{dirE("etc/", 0o755), dirE("tmp/", 0o1777)} {
		tw.WriteHeader(&e.hdr)
	}
	tw.WriteHeader(&tar.Header{Name: "zero-rt", Typeflag: tar.TypeReg, Mode: 0o644, Size: size})
	zeros := make([]byte, 1<<20)
	for i := 0; i < size>>20; i++ {
		tw.Write(zeros)
	}
	tw.Close()
	zw.Close()
	f.Close()
	layer, err := tarball.LayerFromFile(gz)
	if err != nil {
		t.Fatal(err)
	}
	ref := writeImage(t, withConfig(t, layer), "docker-archive", imgDir)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	tname := "rt-zero-" + spacedtest.RandomHex(4)
	_, err = c.BuildTemplate(ctx, client.BuildTemplateRequest{Name: tname, From: client.BuildFrom{Image: ref}}, nil)
	failure, note := opFailure(err)
	var ev string
	filepath.WalkDir(home, func(p string, e fs.DirEntry, err error) error {
		if err == nil && e.Name() == "zero-rt" && e.Type().IsRegular() {
			var st syscall.Stat_t
			if syscall.Lstat(p, &st) == nil && st.Blocks*512 > 64<<20 {
				rel, _ := filepath.Rel(home, p)
				ev = fmt.Sprintf("a 1 MiB compressed layer took %d MiB of host disk (%s)", st.Blocks*512>>20, rel)
			}
		}
		return nil
	})
	if err == nil {
		c.DeleteTemplate(context.Background(), tname)
	}
	rt.judge(t, "images/docker-archive", "compressed-layer-of-1GiB-zeros", ev, failure, note)
}
