package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/spacedtest"
	"github.com/space-sandbox/space/pkg/client"
)

// rtTrap is one trap planted in a sandbox's files: what host code touching the tree afterwards
// must not fall for.
type rtTrap struct {
	name    string
	plant   string   // shell run as root in the sandbox
	verify  string   // shell test that the trap is in place ("" = trust plant)
	probe   string   // shell run in the sandbox an operation derived (writes that must not reach the host)
	read    []string // paths the derived sandbox prints: no canary may show up
	needles []string // canaries this trap aims at
	host    []string // entries of the test's host directory the trap aims at: must not change
	files   []string // base names that must not materialise on the host as special files
	flags   []string // mount options the derived sandbox's overlay root must have
	tpl     bool     // the template's tree must stay as it was
	health  bool     // hostile names: the operation must succeed (or refuse with a 4xx)
	quick   bool     // part of the quick subset
}

// rtOp is one host-side operation on a sandbox with traps; it returns the sandbox that shows its
// result ("" if none) and, for operations that answer with data, the answer.
type rtOp struct {
	name  string
	quick bool
	run   func(ctx context.Context, b *rtBox) (derived string, answer []byte, err error)
}

// rtBox is a sandbox with traps planted, and the snapshots the operations work from.
type rtBox struct {
	rt      *redTeam
	d       *spacedtest.Daemon
	group   string
	traps   []rtTrap
	origin  string
	planted map[string]bool
	s0      string // filesystem snapshot before the traps
	sFS     string // filesystem snapshot with them
	sFull   string // full snapshot with them
	tplDir  string
	tplSum  map[string]string
	cleanup []func()
}

func (b *rtBox) c() *client.Client { return b.d.Client }

func (b *rtBox) plantAll() string {
	var s []string
	for _, tr := range b.traps {
		s = append(s, "( "+tr.plant+" ) >/dev/null 2>&1")
	}
	return strings.Join(s, "\n") + "\ntrue"
}

// setup makes the origin sandbox, takes s0, plants the traps, and takes the snapshots the
// operations use.
func (b *rtBox) setup(t *testing.T) {
	t.Helper()
	c := b.c()
	b.origin = create(t, c, client.CreateSandboxRequest{Template: "minimal"}).ID
	b.tplDir, b.tplSum = templateDigest(t, b.d.Opts.Home, b.origin)
	run(t, c, b.origin, "mkdir -p /root/rt")
	s0, err := c.CreateSnapshot(ctxT(t), b.origin, client.SnapshotFilesystem, "before traps")
	if err != nil {
		t.Fatal(err)
	}
	b.s0 = s0.ID
	if res, err := sh(c, b.origin, b.plantAll(), 2*time.Minute); err != nil {
		t.Fatalf("plant: %v", err)
	} else if res.ExitCode != 0 {
		t.Fatalf("plant: %+v", res)
	}
	b.planted = map[string]bool{}
	for _, tr := range b.traps {
		b.planted[tr.name] = true
		if tr.verify != "" {
			res, err := sh(c, b.origin, tr.verify, 30*time.Second)
			b.planted[tr.name] = err == nil && res.ExitCode == 0
		}
	}
	ctx := ctxT(t)
	if s, err := c.CreateSnapshot(ctx, b.origin, client.SnapshotFilesystem, "traps"); err == nil {
		b.sFS = s.ID
	} else {
		t.Logf("%s: filesystem snapshot with traps: %v", b.group, err)
	}
	if s, err := c.CreateSnapshot(ctx, b.origin, client.SnapshotFull, "traps"); err == nil {
		b.sFull = s.ID
	} else {
		t.Logf("%s: full snapshot with traps: %v", b.group, err)
	}
}

// templateDigest returns the template directory sandbox id stands on and its digest.
func templateDigest(t *testing.T, home, id string) (string, map[string]string) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(home, "runtime", "gvisor", "sandboxes", id, "sandbox.json"))
	if err != nil {
		t.Fatal(err)
	}
	var info struct {
		RootFS string `json:"rootFS"`
	}
	if err := json.Unmarshal(raw, &info); err != nil || info.RootFS == "" {
		t.Fatalf("sandbox.json: %s %v", raw, err)
	}
	return info.RootFS, treeDigest(info.RootFS)
}

var errNoSnapshot = fmt.Errorf("no snapshot to work from (taking it failed)")

func needSnap(id string) error {
	if id == "" {
		return errNoSnapshot
	}
	return nil
}

// boxOps are the host-side operations every trap box goes through, in this order.
func boxOps() []rtOp {
	createFrom := func(sid func(b *rtBox) string) func(ctx context.Context, b *rtBox) (string, []byte, error) {
		return func(ctx context.Context, b *rtBox) (string, []byte, error) {
			if err := needSnap(sid(b)); err != nil {
				return "", nil, err
			}
			sb, err := b.c().CreateSandbox(ctx, client.CreateSandboxRequest{FromSnapshot: sid(b)})
			if err != nil {
				return "", nil, err
			}
			return sb.ID, nil, nil
		}
	}
	wholeRestore := func(sid func(b *rtBox) string) func(ctx context.Context, b *rtBox) (string, []byte, error) {
		return func(ctx context.Context, b *rtBox) (string, []byte, error) {
			if err := needSnap(sid(b)); err != nil {
				return "", nil, err
			}
			v, err := b.c().CreateSandbox(ctx, client.CreateSandboxRequest{Template: "minimal"})
			if err != nil {
				return "", nil, fmt.Errorf("victim: %w", err)
			}
			_, err = b.c().Restore(ctx, v.ID, sid(b))
			return v.ID, nil, err
		}
	}
	return []rtOp{
		{name: "diff", run: func(ctx context.Context, b *rtBox) (string, []byte, error) {
			if err := needSnap(b.sFS); err != nil {
				return "", nil, err
			}
			ch, err := b.c().Diff(ctx, b.sFS, b.s0)
			out, _ := json.Marshal(ch)
			return "", out, err
		}},
		{name: "fs-snapshot+create", quick: true, run: createFrom(func(b *rtBox) string { return b.sFS })},
		{name: "full-snapshot+create", run: createFrom(func(b *rtBox) string { return b.sFull })},
		{name: "fork", run: func(ctx context.Context, b *rtBox) (string, []byte, error) {
			list, err := b.c().ForkSandbox(ctx, b.origin, 1)
			if err != nil || len(list) == 0 {
				return "", nil, err
			}
			return list[0].ID, nil, nil
		}},
		{name: "whole-restore-fs", run: wholeRestore(func(b *rtBox) string { return b.sFS })},
		{name: "whole-restore-full", run: wholeRestore(func(b *rtBox) string { return b.sFull })},
		{name: "restore-paths", run: func(ctx context.Context, b *rtBox) (string, []byte, error) {
			if err := needSnap(b.sFS); err != nil {
				return "", nil, err
			}
			if _, err := sh(b.c(), b.origin, "rm -rf /root/rt /etc/ssl", 30*time.Second); err != nil {
				return "", nil, err
			}
			_, err := b.c().Restore(ctx, b.origin, b.sFS, "/root/rt", "/etc/ssl")
			return b.origin, nil, err
		}},
		{name: "pause", run: func(ctx context.Context, b *rtBox) (string, []byte, error) {
			_, err := b.c().PauseSandbox(ctx, b.origin)
			return "", nil, err
		}},
		{name: "resume", run: func(ctx context.Context, b *rtBox) (string, []byte, error) {
			_, err := b.c().ResumeSandbox(ctx, b.origin)
			return b.origin, nil, err
		}},
		{name: "template-build", quick: true, run: func(ctx context.Context, b *rtBox) (string, []byte, error) {
			name := "rt-" + spacedtest.RandomHex(4)
			var log []string
			_, err := b.c().BuildTemplate(ctx, client.BuildTemplateRequest{Name: name, From: client.BuildFrom{Template: "minimal"},
				Steps: []client.BuildStep{{Run: b.plantAll()}}}, func(l string) { log = append(log, l) })
			if err != nil {
				return "", []byte(strings.Join(log, "\n")), err
			}
			b.cleanup = append(b.cleanup, func() { b.c().DeleteTemplate(context.Background(), name) })
			sb, err := b.c().CreateSandbox(ctx, client.CreateSandboxRequest{Template: name})
			if err != nil {
				return "", []byte(strings.Join(log, "\n")), err
			}
			return sb.ID, []byte(strings.Join(log, "\n")), nil
		}},
	}
}

// runOps applies each operation in turn and judges every trap after each.
func (b *rtBox) runOps(t *testing.T, ops []rtOp) {
	home := b.d.Opts.Home
	upper := filepath.Join("runtime", "gvisor", "sandboxes", b.origin, "upper")
	for _, op := range ops {
		if !b.rt.full && !op.quick {
			continue
		}
		// Set-id files and devices the sandbox itself wrote (through gVisor's gofer) into its
		// own writable layer are not host code materialising them; after a resume that layer
		// was written back by the host, and counts.
		exclude := func(rel string) bool { return op.name != "resume" && rel == upper }
		beforeSpecial := toSet(specialFiles(home, exclude))
		beforeScan := b.rt.scanHome(home)
		beforeHost := treeDigest(b.rt.host)
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		derived, answer, err := op.run(ctx, b)
		cancel()
		b.judgeOp(t, op.name, derived, answer, err, exclude, beforeSpecial, beforeScan, beforeHost)
		if derived != "" && derived != b.origin {
			b.c().DeleteSandbox(context.Background(), derived)
		}
	}
	for _, f := range b.cleanup {
		f()
	}
}

func toSet(l []string) map[string]bool {
	m := map[string]bool{}
	for _, s := range l {
		m[s] = true
	}
	return m
}

func (b *rtBox) judgeOp(t *testing.T, op, derived string, answer []byte, opErr error, exclude func(string) bool,
	beforeSpecial map[string]bool, beforeScan map[string][]string, beforeHost map[string]string) {
	t.Helper()
	c, home := b.c(), b.d.Opts.Home
	failure, note := opFailure(opErr)
	if failure == "" {
		failure = healthy(c, b.origin, derived)
	}
	// What the derived sandbox sees at the traps' paths.
	sections := map[string]string{}
	if derived != "" && opErr == nil {
		var cmd strings.Builder
		for _, tr := range b.traps {
			if tr.probe != "" {
				fmt.Fprintf(&cmd, "( %s ) >/dev/null 2>&1\n", tr.probe)
			}
		}
		for _, tr := range b.traps {
			for _, p := range tr.read {
				fmt.Fprintf(&cmd, "echo '@@%s@@'; head -c 65536 %s 2>/dev/null; echo\n", tr.name, p)
			}
		}
		cmd.WriteString("true")
		res, err := sh(c, derived, cmd.String(), time.Minute)
		if err != nil {
			failure = joinEv(failure, "reading the traps in "+derived+": "+err.Error())
		} else {
			cur := ""
			for _, l := range strings.SplitAfter(res.Stdout, "\n") {
				if n, ok := strings.CutPrefix(strings.TrimSpace(l), "@@"); ok && strings.HasSuffix(n, "@@") {
					cur = strings.TrimSuffix(n, "@@")
					continue
				}
				sections[cur] += l
			}
		}
	}
	allOut := ""
	for _, s := range sections {
		allOut += s
	}
	scan := b.rt.scanHome(home)
	newSpecial := []string{}
	for _, s := range specialFiles(home, exclude) {
		if !beforeSpecial[s] {
			newSpecial = append(newSpecial, s)
		}
	}
	hostChanges := digestChanges(beforeHost, treeDigest(b.rt.host))
	var tplChanges []string
	if b.tplDir != "" {
		tplChanges = digestChanges(b.tplSum, treeDigest(b.tplDir))
	}
	for _, tr := range b.traps {
		if !b.rt.full && !tr.quick {
			continue
		}
		var ev []string
		for _, n := range b.rt.found([]byte(allOut), tr.needles...) {
			ev = append(ev, fmt.Sprintf("canary %s inside %s", n, derived))
		}
		for _, n := range b.rt.found(answer, tr.needles...) {
			ev = append(ev, fmt.Sprintf("canary %s in the API answer", n))
		}
		for _, n := range tr.needles {
			for _, p := range scan[n] {
				if !slices.Contains(beforeScan[n], p) {
					ev = append(ev, fmt.Sprintf("canary %s in host file %s", n, p))
				}
			}
		}
		for _, h := range tr.host {
			for _, ch := range hostChanges {
				if f := strings.Fields(ch); len(f) == 2 && (f[1] == h || strings.HasPrefix(f[1], h+"/")) {
					ev = append(ev, "host "+ch)
				}
			}
		}
		for _, s := range newSpecial {
			base := filepath.Base(strings.Fields(s)[len(strings.Fields(s))-1])
			if slices.Contains(tr.files, base) {
				ev = append(ev, "materialised on the host: "+s)
			}
		}
		if len(tr.flags) > 0 && derived != "" && opErr == nil {
			if m := missingMountFlags(home, derived, tr.flags...); m != "" && b.planted[tr.name] {
				ev = append(ev, m)
			}
		}
		if tr.tpl && len(tplChanges) > 0 {
			ev = append(ev, "template changed: "+strings.Join(tplChanges, ", "))
		}
		trNote := note
		if !b.planted[tr.name] {
			trNote = joinEv("could not be planted inside gVisor", note)
		}
		fail := failure
		if tr.health && note != "" {
			fail = joinEv(fail, note) // hostile names must not make an operation fail
		}
		b.rt.judge(t, b.group, tr.name+"/"+op, trimTo(strings.Join(ev, "; "), 600), fail, trNote)
	}
}

// linkTraps are the traps of the "links" box: links to every host target, devices, set-id
// files, fifos, hard links and the paths the driver mounts over.
func (rt *redTeam) linkTraps(t *testing.T, home string) []rtTrap {
	H := rt.host
	cn := func(n string) string { return rt.canary(t, "L-"+n, 0) }
	dir := func(n string) string {
		rt.canary(t, "L-"+n+"/f", 0)
		return filepath.Join(H, "L-"+n)
	}
	up := strings.Repeat("../", 12)
	if err := syscall.Mkfifo(filepath.Join(H, "L-host.fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	link := func(name, target string, needles ...string) rtTrap {
		return rtTrap{name: name, plant: fmt.Sprintf("ln -s %s /root/rt/%s", target, name), read: []string{"/root/rt/" + name}, needles: needles}
	}
	traps := []rtTrap{
		link("symlink-abs", cn("abs"), "L-abs"),
		link("symlink-rel", strings.TrimSuffix(up, "/")+cn("rel"), "L-rel"),
		link("symlink-dotdot-middle", "/root/../../../.."+cn("mid"), "L-mid"),
		link("symlink-proc1-root", "/proc/1/root"+cn("proc1"), "L-proc1"),
		link("symlink-procself-root", "/proc/self/root"+cn("procself"), "L-procself"),
		link("symlink-procself-environ", "/proc/self/environ", "environ", "admin-key-env"),
		link("symlink-admin.key", filepath.Join(home, "admin.key"), "admin.key"),
		link("symlink-secrets.key", filepath.Join(home, "secrets.key"), "secrets.key"),
		link("symlink-egress-ca.key", filepath.Join(home, "egress-ca.key"), "egress-ca.key"),
		{name: "symlinked-dir-abs", plant: "ln -s " + dir("dirabs") + " /root/rt/dirabs", read: []string{"/root/rt/dirabs/f"}, needles: []string{"L-dirabs/f"}, host: []string{"L-dirabs"}},
		{name: "symlinked-dir-rel", plant: "ln -s " + strings.TrimSuffix(up, "/") + dir("dirrel") + " /root/rt/dirrel", read: []string{"/root/rt/dirrel/f"}, needles: []string{"L-dirrel/f"}, host: []string{"L-dirrel"}},
		{name: "symlinked-dir-dotdot", plant: "ln -s " + strings.TrimSuffix(up, "/") + " /root/rt/up", read: []string{"/root/rt/up" + cn("up")}, needles: []string{"L-up"}},
		{name: "hardlink-template-file", plant: "ln /etc/passwd /root/rt/hl && echo rt-hardlink-write >> /root/rt/hl", verify: "[ -f /root/rt/hl ]", tpl: true},
		{name: "hardlink-pair", plant: "echo one > /root/rt/hla && ln /root/rt/hla /root/rt/hlb", verify: "[ -f /root/rt/hlb ]", health: true},
		{name: "fifo", plant: "mkfifo /root/rt/fifo", verify: "[ -p /root/rt/fifo ]", files: []string{"fifo"}, health: true},
		{name: "symlink-to-host-fifo", plant: "ln -s " + filepath.Join(H, "L-host.fifo") + " /root/rt/fifolink", host: []string{"L-host.fifo"}, health: true},
		{name: "device-null", plant: "mknod /root/rt/devnull c 1 3", verify: "[ -c /root/rt/devnull ]", files: []string{"devnull"}, flags: []string{"nodev"}},
		{name: "device-mem", plant: "mknod /root/rt/devmem c 1 1", verify: "[ -c /root/rt/devmem ]", files: []string{"devmem"}, flags: []string{"nodev"}},
		{name: "device-disk", plant: "mknod /root/rt/devdisk b 254 0", verify: "[ -b /root/rt/devdisk ]", files: []string{"devdisk"}, flags: []string{"nodev"}},
		{name: "setuid-root-file", plant: "cp /bin/busybox /root/rt/suid && chmod 4755 /root/rt/suid", verify: "[ -u /root/rt/suid ]", files: []string{"suid"}, flags: []string{"nosuid"}},
		{name: "setgid-file", plant: "cp /bin/busybox /root/rt/sgid && chmod 2755 /root/rt/sgid", verify: "[ -g /root/rt/sgid ]", files: []string{"sgid"}, flags: []string{"nosuid"}},
		{name: "tmp-symlink-to-host", plant: "(rm -rf /tmp || mv /tmp /tmp.rt); ln -s " + dir("tmpdir") + " /tmp", verify: "[ -L /tmp ]",
			probe: "echo rt > /tmp/rt-written", read: []string{"/tmp/f"}, needles: []string{"L-tmpdir/f"}, host: []string{"L-tmpdir"}},
		{name: "resolv.conf-symlink", plant: "rm -f /etc/resolv.conf; ln -s " + cn("resolv") + " /etc/resolv.conf", verify: "[ -L /etc/resolv.conf ]",
			read: []string{"/etc/resolv.conf"}, needles: []string{"L-resolv"}, host: []string{"L-resolv"}},
		{name: "etc-space-symlink", plant: "rm -rf /etc/space; ln -s " + dir("etcspace") + " /etc/space", verify: "[ -L /etc/space ]",
			read: []string{"/etc/space/f"}, needles: []string{"L-etcspace/f"}, host: []string{"L-etcspace"}},
		{name: "agent-dir-symlink", plant: "rm -rf /.space; ln -s " + dir("dotspace") + " /.space", verify: "[ -L /.space ]",
			read: []string{"/.space/f"}, needles: []string{"L-dotspace/f"}, host: []string{"L-dotspace"}},
		{name: "ca-bundle-symlink-abs", plant: "mkdir -p /etc/ssl/certs && ln -s " + cn("ca") + " /etc/ssl/certs/ca-certificates.crt",
			read: []string{"/etc/space/ca-bundle.crt", "/etc/ssl/certs/ca-certificates.crt"}, needles: []string{"L-ca"}},
	}
	quick := map[string]bool{"symlink-abs": true, "symlink-procself-environ": true, "symlink-admin.key": true, "symlinked-dir-abs": true,
		"fifo": true, "setuid-root-file": true, "ca-bundle-symlink-abs": true, "device-mem": true}
	for i := range traps {
		traps[i].quick = quick[traps[i].name]
	}
	return traps
}

// caTraps are one-trap boxes: the CA-bundle code reads etc/ssl/certs/ca-certificates.crt of a
// sandbox's layers, one path per sandbox, so each target needs its own sandbox.
func (rt *redTeam) caTraps(t *testing.T, home string) []rtTrap {
	H := rt.host
	cn := func(n string) string { return rt.canary(t, "CA-"+n, 0) }
	bundle := "/etc/ssl/certs/ca-certificates.crt"
	reads := []string{"/etc/space/ca-bundle.crt", bundle}
	link := func(name, target string, needles ...string) rtTrap {
		return rtTrap{name: name, plant: "mkdir -p /etc/ssl/certs && ln -s " + target + " " + bundle, read: reads, needles: needles}
	}
	rt.canary(t, "CA-ssldir/certs/ca-certificates.crt", 0)
	rt.canary(t, "CA-certsdir/ca-certificates.crt", 0)
	traps := []rtTrap{
		link("ca-bundle-symlink-rel", strings.Repeat("../", 12)+strings.TrimPrefix(cn("rel"), "/"), "CA-rel"),
		link("ca-bundle-symlink-procself-environ", "/proc/self/environ", "environ", "admin-key-env"),
		link("ca-bundle-symlink-admin.key", filepath.Join(home, "admin.key"), "admin.key"),
		link("ca-bundle-symlink-secrets.key", filepath.Join(home, "secrets.key"), "secrets.key"),
		link("ca-bundle-symlink-egress-ca.key", filepath.Join(home, "egress-ca.key"), "egress-ca.key"),
		link("ca-bundle-symlink-proc1-root", "/proc/1/root"+cn("proc1"), "CA-proc1"),
		link("ca-bundle-symlink-dotdot-middle", "/etc/../../../.."+cn("mid"), "CA-mid"),
		{name: "ca-bundle-symlinked-ssl-dir", plant: "rm -rf /etc/ssl; ln -s " + filepath.Join(H, "CA-ssldir") + " /etc/ssl", read: reads, needles: []string{"CA-ssldir/certs/ca-certificates.crt"}},
		{name: "ca-bundle-symlinked-certs-dir", plant: "mkdir -p /etc/ssl && ln -s " + filepath.Join(H, "CA-certsdir") + " /etc/ssl/certs", read: reads, needles: []string{"CA-certsdir/ca-certificates.crt"}},
	}
	traps[1].quick = true
	return traps
}

// nameTraps are trees host code must handle without failing: deeper than PATH_MAX, names that
// are not UTF-8 or hold control characters.
func nameTraps() []rtTrap {
	return []rtTrap{
		{name: "path-longer-than-PATH_MAX", health: true, quick: true,
			plant:  `cd /root/rt && i=0; while [ $i -lt 24 ]; do n=$(printf 'd%0199d' $i); mkdir $n && cd $n || exit 1; i=$((i+1)); done; echo deep > leaf && touch /root/rt/long-ok`,
			verify: `[ -e /root/rt/long-ok ]`},
		{name: "nesting-2100-deep", health: true,
			plant:  `mkdir -p /root/rt/nest && cd /root/rt/nest && i=0; while [ $i -lt 2100 ]; do mkdir n && cd n || exit 1; i=$((i+1)); done; echo deep > leaf && touch /root/rt/nest-ok`,
			verify: `[ -e /root/rt/nest-ok ]`},
		{name: "non-utf8-names", health: true, quick: true,
			plant:  `cd /root/rt && touch "f-$(printf '\377\376')" && mkdir "d-$(printf '\303\050')" && echo x > "d-$(printf '\303\050')/g-$(printf '\200')"`,
			verify: `[ -e "/root/rt/f-$(printf '\377\376')" ]`},
		{name: "control-char-names", health: true,
			plant:  `cd /root/rt && touch "$(printf 'a\nb\tc\033[31m')" "$(printf 'x\r')"`,
			verify: `[ -e "/root/rt/$(printf 'x\r')" ]`},
	}
}

func (rt *redTeam) filesGroup(t *testing.T) {
	d := rt.rtDaemon(t)
	home := d.Opts.Home
	t.Run("links", func(t *testing.T) {
		t.Parallel()
		b := &rtBox{rt: rt, d: d, group: "files/links", traps: rt.linkTraps(t, home)}
		b.setup(t)
		b.runOps(t, boxOps())
	})
	for _, tr := range rt.caTraps(t, home) {
		if !rt.full && !tr.quick {
			continue
		}
		t.Run(tr.name, func(t *testing.T) {
			t.Parallel()
			b := &rtBox{rt: rt, d: d, group: "files/ca", traps: []rtTrap{tr}}
			b.setup(t)
			var ops []rtOp
			for _, op := range boxOps() {
				if op.name != "diff" && op.name != "restore-paths" && op.name != "whole-restore-full" {
					ops = append(ops, op)
				}
			}
			b.runOps(t, ops)
		})
	}
	t.Run("names", func(t *testing.T) {
		t.Parallel()
		b := &rtBox{rt: rt, d: d, group: "files/names", traps: nameTraps()}
		b.setup(t)
		rt.filesAPIAttempts(t, b)
		b.runOps(t, boxOps())
	})
	if rt.full {
		t.Run("race", func(t *testing.T) {
			t.Parallel()
			rt.raceAttempts(t, d)
		})
	}
	t.Run("template-links", func(t *testing.T) {
		t.Parallel()
		rt.templateLinkAttempts(t, d)
	})
}

// filesAPIAttempts send hostile names through the files API: a clear 4xx, or success, never a
// 5xx, and the sandbox stays well.
func (rt *redTeam) filesAPIAttempts(t *testing.T, b *rtBox) {
	c := b.c()
	deep := "/root/rt" + strings.Repeat("/d0123456789", 400)
	type attempt struct {
		name string
		fn   func(ctx context.Context) error
	}
	for _, a := range []attempt{
		{"list-dir-with-non-utf8-names", func(ctx context.Context) error { _, err := c.ListDir(ctx, b.origin, "/root/rt"); return err }},
		{"download-non-utf8-path", func(ctx context.Context) error {
			r, err := c.Download(ctx, b.origin, "/root/rt/f-\xff\xfe")
			if err == nil {
				r.Close()
			}
			return err
		}},
		{"upload-non-utf8-path", func(ctx context.Context) error {
			_, err := c.Upload(ctx, b.origin, "/root/rt/up-\xff", strings.NewReader("x"), nil)
			return err
		}},
		{"list-path-longer-than-PATH_MAX", func(ctx context.Context) error { _, err := c.ListDir(ctx, b.origin, deep); return err }},
		{"exec-cwd-non-utf8", func(ctx context.Context) error {
			_, err := c.Exec(ctx, b.origin, client.ExecRequest{Command: "pwd", Cwd: "/root/rt/d-\xc3\x28"})
			return err
		}},
	} {
		if !rt.full && a.name != "list-dir-with-non-utf8-names" && a.name != "download-non-utf8-path" {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		err := a.fn(ctx)
		cancel()
		failure, note := opFailure(err)
		if failure == "" {
			failure = healthy(c, b.origin)
		}
		rt.judge(t, "files/names", "files-api/"+a.name, "", failure, note)
	}
}

// raceAttempts swap, inside a running sandbox, directories holding a regular file and a symlink
// to a host canary (or a fifo) while filesystem snapshots are taken: a capture that checks a
// path and then opens it by name again reads the host file (or blocks on the fifo).
func (rt *redTeam) raceAttempts(t *testing.T, d *spacedtest.Daemon) {
	c := d.Client
	const pairs = 16
	var names []string
	var plant strings.Builder
	for i := 0; i < pairs; i++ {
		n := fmt.Sprintf("R-%d", i)
		names = append(names, n)
		p := rt.canary(t, n, 64) // the same size as the regular file it stands in for
		fmt.Fprintf(&plant, "mkdir -p /root/race/a%d /root/race/b%d /root/fifo/c%d /root/fifo/d%d && "+
			"head -c 63 /dev/zero | tr '\\0' r > /root/race/a%d/x && echo >> /root/race/a%d/x && ln -s %s /root/race/b%d/x && "+
			"head -c 63 /dev/zero | tr '\\0' f > /root/fifo/c%d/x && echo >> /root/fifo/c%d/x && mkfifo /root/fifo/d%d/x\n", i, i, i, i, i, i, p, i, i, i, i)
	}
	id := create(t, c, client.CreateSandboxRequest{Template: "minimal"}).ID
	if res := run(t, c, id, plant.String()+"true"); res.ExitCode != 0 {
		t.Fatalf("plant: %+v", res)
	}
	time.Sleep(1500 * time.Millisecond) // the files' ctime is well before any capture
	loop := func(dir, a, b string) string {
		return fmt.Sprintf("cd %s; while [ ! -e /root/stop ]; do for i in $(seq 0 %d); do mv %s$i t$i; mv %s$i %s$i; mv t$i %s$i; done; done", dir, pairs-1, a, b, a, b)
	}
	for _, l := range []string{loop("/root/race", "a", "b"), loop("/root/fifo", "c", "d")} {
		if _, err := c.ExecBackground(ctxT(t), id, client.ExecRequest{Command: l}); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(300 * time.Millisecond)
	upper := filepath.Join(d.Opts.Home, "runtime", "gvisor", "sandboxes", id, "upper", "root", "fifo")
	unblock := func() { // a capture blocked opening a fifo for reading is released by a writer
		for i := 0; i < pairs; i++ {
			for _, s := range []string{"c", "d"} {
				if fd, err := syscall.Open(filepath.Join(upper, fmt.Sprintf("%s%d", s, i), "x"), syscall.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
					syscall.Close(fd)
				}
			}
		}
	}
	rounds := []string{"fs-snapshot-1", "fs-snapshot-2", "fs-snapshot-3", "fs-snapshot-4", "fs-snapshot-5", "full-snapshot", "fork"}
	for _, round := range rounds {
		before := rt.scanHome(d.Opts.Home)
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		var derived string
		var err error
		switch round {
		case "fork":
			var list []client.Sandbox
			if list, err = c.ForkSandbox(ctx, id, 1); err == nil && len(list) > 0 {
				derived = list[0].ID
			}
		default:
			kind := client.SnapshotFilesystem
			if round == "full-snapshot" {
				kind = client.SnapshotFull
			}
			var s *client.Snapshot
			if s, err = c.CreateSnapshot(ctx, id, kind, round); err == nil {
				var sb *client.Sandbox
				if sb, err = c.CreateSandbox(ctx, client.CreateSandboxRequest{FromSnapshot: s.ID}); err == nil {
					derived = sb.ID
				}
			}
		}
		cancel()
		failure, note := opFailure(err)
		if failure != "" {
			for i := 0; i < 20 && healthy(c) == ""; i++ {
				unblock()
				time.Sleep(500 * time.Millisecond)
			}
		}
		var ev []string
		if derived != "" {
			res, rerr := sh(c, derived, "touch /root/stop; cat /root/race/*/x 2>/dev/null", 30*time.Second)
			if rerr == nil {
				for _, n := range rt.found([]byte(res.Stdout), names...) {
					ev = append(ev, "canary "+n+" inside "+derived)
				}
			}
		}
		scan := rt.scanHome(d.Opts.Home)
		for _, n := range names {
			for _, p := range scan[n] {
				if !slices.Contains(before[n], p) {
					ev = append(ev, "canary "+n+" in host file "+p)
				}
			}
		}
		if failure == "" {
			failure = healthy(c, id, derived)
		}
		rt.judge(t, "files/race", "symlink-and-fifo-dir-swap/"+round, trimTo(strings.Join(ev, "; "), 600), failure, note)
		if derived != "" {
			c.DeleteSandbox(context.Background(), derived)
		}
	}
	sh(c, id, "touch /root/stop", 30*time.Second)
}

// templateLinkAttempts: a template built by a hostile step holds links to the host root; restore
// by paths and diff look paths up through the template's layers on the host.
func (rt *redTeam) templateLinkAttempts(t *testing.T, d *spacedtest.Daemon) {
	c := d.Client
	H := rt.host
	root := rt.canary(t, "T-root", 0)
	rel := rt.canary(t, "T-rel", 0)
	rt.canary(t, "T-dir/f", 0)
	oracle := rt.canary(t, "T-oracle", 0)
	name := "rt-links-" + spacedtest.RandomHex(4)
	ctx := ctxT(t)
	_, err := c.BuildTemplate(ctx, client.BuildTemplateRequest{Name: name, From: client.BuildFrom{Template: "minimal"}, Steps: []client.BuildStep{{
		Run: fmt.Sprintf("ln -s / /hostroot && ln -s %s /hostrel && ln -s %s /hostdir", strings.TrimSuffix(strings.Repeat("../", 12), "/"), filepath.Join(H, "T-dir"))}}}, nil)
	if err != nil {
		t.Fatalf("build: %v", err)
	}
	defer c.DeleteTemplate(context.Background(), name)
	id := create(t, c, client.CreateSandboxRequest{Template: name}).ID
	s1 := snapshot(t, c, id, client.SnapshotFilesystem, "s1")
	home := d.Opts.Home
	type attempt struct {
		name, path, read string
		needles          []string
		quick            bool
	}
	for _, a := range []attempt{
		{"restore-paths-through-template-link-to-root", "/hostroot" + root, "/hostroot" + root, []string{"T-root"}, true},
		{"restore-paths-through-template-relative-link", "/hostrel" + rel, "/hostrel" + rel, []string{"T-rel"}, false},
		{"restore-paths-of-template-link-to-host-dir", "/hostdir", "/hostdir/f", []string{"T-dir/f"}, false},
		{"restore-paths-admin.key-through-template-link", "/hostroot" + filepath.Join(home, "admin.key"), "/hostroot" + filepath.Join(home, "admin.key"), []string{"admin.key"}, false},
		{"restore-paths-secrets.key-through-template-link", "/hostroot" + filepath.Join(home, "secrets.key"), "/hostroot" + filepath.Join(home, "secrets.key"), []string{"secrets.key"}, false},
	} {
		if !rt.full && !a.quick {
			continue
		}
		before := rt.scanHome(home)
		rctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		_, err := c.Restore(rctx, id, s1.ID, a.path)
		cancel()
		failure, note := opFailure(err)
		var ev []string
		if res, err := sh(c, id, "cat "+a.read+" 2>/dev/null", 30*time.Second); err == nil {
			for _, n := range rt.found([]byte(res.Stdout), a.needles...) {
				ev = append(ev, "canary "+n+" inside the sandbox after restoring "+a.path)
			}
		}
		scan := rt.scanHome(home)
		for _, n := range a.needles {
			for _, p := range scan[n] {
				if !slices.Contains(before[n], p) {
					ev = append(ev, "canary "+n+" in host file "+p)
				}
			}
		}
		if failure == "" {
			failure = healthy(c, id)
		}
		rt.judge(t, "files/template", a.name, strings.Join(ev, "; "), failure, note)
	}
	if rt.full {
		// Existence oracle: a path added under a directory that replaced the template's link is
		// "modified" if the diff finds it through the link on the host.
		control := filepath.Join(H, "T-oracle-control-absent")
		run(t, c, id, fmt.Sprintf("rm /hostroot && mkdir -p /hostroot%s && echo x > /hostroot%s && echo x > /hostroot%s", H, oracle, control))
		s2 := snapshot(t, c, id, client.SnapshotFilesystem, "s2")
		changes, err := c.Diff(ctx, s2.ID, s1.ID)
		failure, note := opFailure(err)
		rt.judge(t, "files/template", "diff-existence-oracle-through-template-link", oracleEvidence(changes, "/hostroot"+oracle, "/hostroot"+control), failure, note)
	}
}

// oracleEvidence reports a diff telling a path that exists on the host (canary) from one that
// does not (control), both added by the sandbox alike.
func oracleEvidence(changes []client.Change, canary, control string) string {
	ops := map[string]string{}
	for _, ch := range changes {
		ops[ch.Path] = ch.Op
	}
	if ops[canary] != ops[control] {
		return fmt.Sprintf("the diff calls %s %q but %s %q: it looked the path up on the host", canary, ops[canary], control, ops[control])
	}
	return ""
}
