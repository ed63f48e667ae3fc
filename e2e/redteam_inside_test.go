package e2e

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/spacedtest"
	"github.com/space-sandbox/space/pkg/client"
)

// insideGroup: /proc, /sys and mount tricks inside gVisor, each judged on the host.
func (rt *redTeam) insideGroup(t *testing.T) {
	d := rt.rtDaemon(t)
	c, home := d.Client, d.Opts.Home
	H := rt.host
	id := create(t, c, client.CreateSandboxRequest{Template: "minimal"}).ID
	marker := "rt-" + spacedtest.RandomHex(6)
	// A host process the sandbox must not see or signal.
	hostProc := exec.Command("sh", "-c", "sleep 600", "RTC-hostproc-"+marker)
	if err := hostProc.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { hostProc.Process.Kill(); hostProc.Wait() }()
	rt.needle("hostproc", []byte("RTC-hostproc-"+marker))
	rt.needle("home-path", []byte(home))
	proc1 := rt.canary(t, "P-proc1", 0)
	procself := rt.canary(t, "P-procself", 0)
	nsenter := rt.canary(t, "P-nsenter", 0)
	chroot := rt.canary(t, "P-chroot", 0)
	runscSum := fileSum(t, filepath.Join(os.Getenv("SPACE_BIN"), "runsc"))
	spacedSum := fileSum(t, filepath.Join(os.Getenv("SPACE_BIN"), "spaced"))
	cmdline, _ := os.ReadFile("/proc/cmdline")
	corePattern, _ := os.ReadFile("/proc/sys/kernel/core_pattern")
	hostname, _ := os.Hostname()
	cg := sandboxCgroupFiles(d.Opts.Instance, id)
	cgBefore := readAll(cg)
	var hostVeths []string
	if ifs, err := net.Interfaces(); err == nil {
		for _, i := range ifs {
			if strings.HasPrefix(i.Name, "sp"+d.Opts.Instance) {
				hostVeths = append(hostVeths, i.Name)
			}
		}
	}
	dev := rootDevice()
	hostDevBytes := readDevice(dev.path)
	sections := []struct{ name, cmd string }{
		{"proc-cmdline-of-all-processes", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '"},
		{"proc-environ-of-all-processes", "cat /proc/[0-9]*/environ | tr '\\0' '\\n'"},
		{"proc1-root-to-host-file", "cat /proc/1/root" + proc1},
		{"procself-root-to-host-file", "cat /proc/self/root" + procself},
		{"nsenter-pid1-to-host-file", "nsenter -t 1 -m -p -n cat " + nsenter},
		{"chroot-escape-to-host-file", "mkdir -p /root/jail && cd /root && chroot /root/jail /bin/busybox cat ../../../../.." + chroot + "; cat " + chroot},
		{"procself-exe-is-sentry", "sha256sum /proc/self/exe /proc/1/exe /proc/[0-9]*/exe"},
		{"mountinfo-host-paths", "cat /proc/self/mountinfo /proc/mounts /proc/1/mountinfo"},
		{"proc-maps-host-paths", "cat /proc/1/maps /proc/self/maps"},
		{"kernel-cmdline", "cat /proc/cmdline"},
		{"sys-class-net-host-links", "ls /sys/class/net; cat /proc/net/dev"},
		{"kill-host-process", fmt.Sprintf("kill -9 %d", hostProc.Process.Pid)},
		{"write-core_pattern", "echo '|/bin/" + marker + "' > /proc/sys/kernel/core_pattern"},
		{"write-hostname", "hostname " + marker + "; echo " + marker + " > /proc/sys/kernel/hostname"},
		{"write-own-cgroup-limits", "for f in memory.max pids.max cpu.max memory/memory.limit_in_bytes pids/pids.max; do echo max > /sys/fs/cgroup/$f; echo 99999999999 > /sys/fs/cgroup/$f; done"},
		{"mount-tmpfs", "mkdir -p /mnt/a && mount -t tmpfs " + marker + "-tmpfs /mnt/a"},
		{"mount-bind-root", "mkdir -p /mnt/b && mount --bind / /mnt/b && touch /mnt/b/" + marker},
		{"mount-proc-and-sysfs", "mkdir -p /mnt/c /mnt/d && mount -t proc " + marker + "-proc /mnt/c; mount -t sysfs " + marker + "-sys /mnt/d"},
		{"umount-bind-mounts", "umount /etc/resolv.conf; umount /tmp; umount /.space/space-agent; umount -l /etc/space/ca.crt; echo rt > /tmp/" + marker},
		{"mknod-host-root-disk", fmt.Sprintf("mknod /root/rtdisk b %d %d && head -c 4096 /root/rtdisk | od -An -tx1 | tr -d ' \\n'", dev.major, dev.minor)},
		{"dev-and-kmsg", "head -c 4096 /dev/kmsg; dmesg | head -50; ls -la /dev"},
	}
	var cmd strings.Builder
	for _, s := range sections {
		fmt.Fprintf(&cmd, "echo '@@%s@@'; ( %s ) 2>/dev/null\n", s.name, s.cmd)
	}
	cmd.WriteString("true")
	res, err := sh(c, id, cmd.String(), 90*time.Second)
	if err != nil {
		t.Fatalf("attacker: %v", err)
	}
	time.Sleep(300 * time.Millisecond)
	out := map[string]string{}
	cur := ""
	for _, l := range strings.SplitAfter(res.Stdout, "\n") {
		if n, ok := strings.CutPrefix(strings.TrimSpace(l), "@@"); ok && strings.HasSuffix(n, "@@") {
			cur = strings.TrimSuffix(n, "@@")
			continue
		}
		out[cur] += l
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	coreAfter, _ := os.ReadFile("/proc/sys/kernel/core_pattern")
	if string(coreAfter) != string(corePattern) {
		os.WriteFile("/proc/sys/kernel/core_pattern", corePattern, 0o644)
	}
	hostnameAfter, _ := os.Hostname()
	if hostnameAfter != hostname {
		exec.Command("hostname", hostname).Run()
	}
	judge := func(name, escape string) { rt.judge(t, "inside", name, escape, healthy(c, id), "") }
	leak := func(name string, needles ...string) {
		var ev []string
		for _, n := range rt.found([]byte(out[name]), needles...) {
			ev = append(ev, "canary "+n+" in the sandbox's output")
		}
		judge(name, strings.Join(ev, "; "))
	}
	leak("proc-cmdline-of-all-processes", "hostproc", "admin-key-env", "environ")
	leak("proc-environ-of-all-processes", "hostproc", "admin-key-env", "environ", "secrets.key", "egress-ca.key")
	leak("proc1-root-to-host-file", "P-proc1")
	leak("procself-root-to-host-file", "P-procself")
	leak("nsenter-pid1-to-host-file", "P-nsenter")
	leak("chroot-escape-to-host-file", "P-chroot")
	var exeEv string
	if strings.Contains(out["procself-exe-is-sentry"], runscSum) || strings.Contains(out["procself-exe-is-sentry"], spacedSum) {
		exeEv = "a process's /proc/<pid>/exe inside is the host's runsc or spaced binary"
	}
	judge("procself-exe-is-sentry", exeEv)
	leak("mountinfo-host-paths", "home-path")
	leak("proc-maps-host-paths", "home-path")
	var cmdEv string
	if c := strings.TrimSpace(string(cmdline)); c != "" && strings.Contains(out["kernel-cmdline"], c) {
		cmdEv = "the host's kernel command line: " + trimTo(c, 80)
	}
	judge("kernel-cmdline", cmdEv)
	var netEv []string
	for _, v := range hostVeths {
		if strings.Contains(out["sys-class-net-host-links"], v) {
			netEv = append(netEv, "host link "+v+" listed inside")
		}
	}
	judge("sys-class-net-host-links", strings.Join(netEv, "; "))
	var killEv string
	if st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", hostProc.Process.Pid)); err != nil || strings.Contains(string(st), ") Z ") || syscall.Kill(hostProc.Process.Pid, 0) != nil {
		killEv = fmt.Sprintf("host process %d was killed", hostProc.Process.Pid)
	}
	judge("kill-host-process", killEv)
	var coreEv string
	if string(coreAfter) != string(corePattern) {
		coreEv = fmt.Sprintf("host core_pattern changed to %q", coreAfter)
	}
	judge("write-core_pattern", coreEv)
	var hostEv string
	if hostnameAfter != hostname {
		hostEv = "host hostname changed to " + hostnameAfter
	}
	judge("write-hostname", hostEv)
	var cgEv []string
	for f, v := range readAll(cg) {
		if v != cgBefore[f] {
			cgEv = append(cgEv, fmt.Sprintf("%s changed from %q to %q", f, cgBefore[f], v))
		}
	}
	judge("write-own-cgroup-limits", strings.Join(cgEv, "; "))
	for _, n := range []string{"mount-tmpfs", "mount-bind-root", "mount-proc-and-sysfs"} {
		var ev string
		if strings.Contains(string(mounts), marker) {
			ev = "a mount named by the sandbox is in the host's mount table"
		}
		judge(n, ev)
	}
	var umEv string
	if _, err := os.Stat("/tmp/" + marker); err == nil {
		umEv = "/tmp/" + marker + " was created on the host"
		os.Remove("/tmp/" + marker)
	}
	if _, err := os.Stat("/" + marker); err == nil {
		umEv = joinEv(umEv, "/"+marker+" was created on the host")
		os.Remove("/" + marker)
	}
	judge("umount-bind-mounts", umEv)
	var devEv string
	if got := strings.TrimSpace(out["mknod-host-root-disk"]); hostDevBytes != "" && got != "" && got == hostDevBytes {
		devEv = fmt.Sprintf("the sandbox read the first 4 KiB of the host's %s", dev.path)
	}
	judge("mknod-host-root-disk", devEv)
	leak("dev-and-kmsg", "hostproc", "environ", "admin-key-env")
	_ = H
}

func fileSum(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// sandboxCgroupFiles are the host files holding sandbox id's limits (cgroup v2 and v1).
func sandboxCgroupFiles(instance, id string) []string {
	cg := filepath.Join("space-"+instance, id)
	return []string{
		filepath.Join("/sys/fs/cgroup", cg, "memory.max"), filepath.Join("/sys/fs/cgroup", cg, "pids.max"), filepath.Join("/sys/fs/cgroup", cg, "cpu.max"),
		filepath.Join("/sys/fs/cgroup/memory", cg, "memory.limit_in_bytes"), filepath.Join("/sys/fs/cgroup/pids", cg, "pids.max"),
		filepath.Join("/sys/fs/cgroup/cpu", cg, "cpu.cfs_quota_us"),
	}
}

func readAll(files []string) map[string]string {
	m := map[string]string{}
	for _, f := range files {
		if b, err := os.ReadFile(f); err == nil {
			m[f] = strings.TrimSpace(string(b))
		}
	}
	return m
}

type blockDev struct {
	major, minor uint64
	path         string
}

// rootDevice is the block device holding the host's root file system (254:0 if unknown).
func rootDevice() blockDev {
	d := blockDev{major: 254, minor: 0, path: "/dev/vda"}
	var st struct{ dev uint64 }
	if fi, err := os.Stat("/"); err == nil {
		if s, ok := fi.Sys().(interface{ Dev() uint64 }); ok {
			st.dev = s.Dev()
		}
	}
	if b, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			f := strings.Fields(l)
			if len(f) > 9 && f[4] == "/" {
				if mm := strings.Split(f[2], ":"); len(mm) == 2 {
					d.major, _ = strconv.ParseUint(mm[0], 10, 64)
					d.minor, _ = strconv.ParseUint(mm[1], 10, 64)
				}
				for i := 6; i < len(f); i++ {
					if f[i] == "-" && i+2 < len(f) && strings.HasPrefix(f[i+2], "/dev/") {
						d.path = f[i+2]
					}
				}
			}
		}
	}
	_ = st
	return d
}

// readDevice returns the first 4 KiB of a block device as hex ("" if unreadable).
func readDevice(p string) string {
	f, err := os.Open(p)
	if err != nil {
		return ""
	}
	defer f.Close()
	b := make([]byte, 4096)
	n, _ := io.ReadFull(f, b)
	if n == 0 {
		return ""
	}
	return hex.EncodeToString(b[:n])
}

// networkGroup: from inside, the host's ports (loopback and any address), spaced's API and
// other sandboxes. Spaced runs in a network namespace of the test's own, routed only to "the
// internet" namespace, so nothing a sandbox sends can leave the test's namespaces.
func (rt *redTeam) networkGroup(t *testing.T) {
	in := newInternet(t)
	loopPort, anyPort := "127.0.0.1:7811", "0.0.0.0:7812"
	for _, a := range []string{loopPort, anyPort} {
		if err := in.HostListener(a); err != nil {
			t.Fatal(err)
		}
	}
	d := startSpacedIn(t, in)
	c := d.Client
	ctx := ctxT(t)
	_, spacedPort, _ := net.SplitHostPort(d.Opts.Listen)
	hc := &http.Client{Transport: &http.Transport{DialContext: spacedtest.NetnsDialer(nsPath(in.HostNS))}}
	metrics := func() string {
		resp, err := hc.Get(d.URL + "/metrics")
		if err != nil {
			return ""
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	// Control: the evidence channels see the test's own attempts.
	spacedtest.InNetns(nsPath(in.HostNS), func() error {
		if conn, err := net.DialTimeout("tcp", "127.0.0.1:7811", time.Second); err == nil {
			conn.Close()
		}
		return nil
	})
	// spaced counts methods outside the standard ones as OTHER (bounded labels); nobody but the
	// attacker and this control sends such methods, so the OTHER count is the evidence.
	others := func() int {
		n := 0
		for line := range strings.Lines(metrics()) {
			if strings.HasPrefix(line, "space_http_requests_total{") && strings.Contains(line, `method="OTHER"`) {
				var v int
				if _, err := fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &v); err == nil {
					n += v
				}
			}
		}
		return n
	}
	othersBefore := others()
	if req, _ := http.NewRequest("RTCONTROL", d.URL+"/healthz", nil); req != nil {
		if resp, err := hc.Do(req); err == nil {
			resp.Body.Close()
		}
	}
	time.Sleep(200 * time.Millisecond)
	if !in.Saw("host port " + loopPort) {
		t.Fatalf("control: the loopback listener did not record the test's own connection: %v", in.Seen())
	}
	if others() <= othersBefore {
		t.Fatal("control: spaced's request metrics do not show the test's own request")
	}

	victim := create(t, c, client.CreateSandboxRequest{Template: "minimal"}).ID
	victimTok := "RTC-victim-" + spacedtest.RandomHex(12)
	rt.needle("victim", []byte(victimTok))
	if _, err := c.Upload(ctx, victim, "/root/victim.canary", strings.NewReader(victimTok+"\n"), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ExecBackground(ctx, victim, client.ExecRequest{Command: "while true; do nc -l -p 8080 </dev/null >/dev/null 2>&1; echo conn >> /root/hits; done"}); err != nil {
		t.Fatal(err)
	}
	attacker := create(t, c, client.CreateSandboxRequest{Template: "minimal"}).ID
	ip := func(id string) string {
		return strings.TrimSpace(run(t, c, id, `ip -4 -o addr show | awk '$2 != "lo" {split($4, a, "/"); print a[1]; exit}'`).Stdout)
	}
	victimIP := ip(victim)
	gw := strings.TrimSpace(run(t, c, attacker, `awk '/nameserver/ {print $2}' /etc/resolv.conf`).Stdout)
	_, lp, _ := net.SplitHostPort(loopPort)
	_, ap, _ := net.SplitHostPort(anyPort)
	tcp := func(host, port, line string) string {
		return fmt.Sprintf("printf '%s\\r\\n\\r\\n' | nc -w 2 %s %s", line, host, port)
	}
	type attempt struct {
		name, cmd, method, listener string
	}
	attempts := []attempt{
		{"host-loopback-port-via-sandbox-loopback", tcp("127.0.0.1", lp, "hello"), "", loopPort},
		{"host-loopback-port-via-gateway", tcp(gw, lp, "hello"), "", loopPort},
		{"host-any-address-port-via-gateway", tcp(gw, ap, "hello"), "", anyPort},
		{"host-any-address-port-via-host-address", tcp(spacedtest.SpacedAddr, ap, "hello"), "", anyPort},
		{"spaced-api-via-sandbox-loopback", tcp("127.0.0.1", spacedPort, "RTLOOP / HTTP/1.1\\r\\nHost: x"), "RTLOOP", ""},
		{"spaced-api-via-gateway", tcp(gw, spacedPort, "RTGW / HTTP/1.1\\r\\nHost: x"), "RTGW", ""},
		{"spaced-api-via-host-address", tcp(spacedtest.SpacedAddr, spacedPort, "RTHOST / HTTP/1.1\\r\\nHost: x"), "RTHOST", ""},
		{"spaced-api-via-http-proxy-request", tcp(gw, "80", "RTPROXY http://127.0.0.1:"+spacedPort+"/healthz HTTP/1.1\\r\\nHost: 127.0.0.1:"+spacedPort), "RTPROXY", ""},
		{"other-sandbox-port", tcp(victimIP, "8080", "hello"), "", ""},
		{"other-sandbox-agent-files-with-own-token", `tok=$(tr '\0' '\n' < /proc/1/environ | sed -n 's/^SPACE_AGENT_TOKEN=//p'); wget -q -T 3 -O - --header "X-Access-Token: $tok" "http://` + victimIP + `:49983/files?path=/root/victim.canary"`, "", ""},
		{"other-sandbox-agent-files-without-token", `wget -q -T 3 -O - "http://` + victimIP + `:49983/files?path=/root/victim.canary&username=root"`, "", ""},
	}
	for _, a := range attempts {
		served := others()
		res, err := sh(c, attacker, "( "+a.cmd+" ) 2>/dev/null; true", 30*time.Second)
		time.Sleep(300 * time.Millisecond)
		var ev []string
		if err == nil {
			for _, n := range rt.found([]byte(res.Stdout), "victim", "admin-key-env") {
				ev = append(ev, "canary "+n+" in the attacker's output")
			}
		}
		if a.listener != "" && in.Saw("host port "+a.listener) && !strings.Contains(a.name, "control") {
			for _, l := range in.Seen() {
				if strings.Contains(l, "host port "+a.listener) && !strings.Contains(l, "127.0.0.1:") {
					ev = append(ev, l)
				}
			}
		}
		if a.method != "" && others() > served {
			ev = append(ev, "spaced served the sandbox's "+a.method+" request")
		}
		if a.name == "other-sandbox-port" {
			if out := run(t, c, victim, "cat /root/hits 2>/dev/null; true").Stdout; strings.Contains(out, "conn") {
				ev = append(ev, "the other sandbox's listener was reached")
			}
		}
		rt.judge(t, "network", a.name, strings.Join(ev, "; "), healthy(c, attacker, victim), "")
	}
	if rt.full {
		rt.connectionFlood(t, d, attacker, gw)
	}
}

// connectionFlood: a sandbox opens 1000 connections to its gateway and holds them; spaced must
// keep answering and other sandboxes keep working.
func (rt *redTeam) connectionFlood(t *testing.T, d *spacedtest.Daemon, id, gw string) {
	c := d.Client
	fdsBefore := countFDs(d.PID())
	sh(c, id, fmt.Sprintf("i=0; while [ $i -lt 1000 ]; do (sleep 20 | nc %s 80 >/dev/null 2>&1 &); i=$((i+1)); done", gw), 60*time.Second)
	time.Sleep(3 * time.Second)
	fdsDuring := countFDs(d.PID())
	t0 := time.Now()
	failure := healthy(c)
	other := create(t, c, client.CreateSandboxRequest{Template: "minimal"}).ID
	if res, err := sh(c, other, "echo ok", 30*time.Second); err != nil || res.Stdout != "ok\n" {
		failure = joinEv(failure, fmt.Sprintf("another sandbox's command failed during the flood: %+v %v", res, err))
	}
	if el := time.Since(t0); el > 20*time.Second {
		failure = joinEv(failure, fmt.Sprintf("spaced took %v to answer during the flood", el))
	}
	rt.judge(t, "resources", "connection-flood-1000-to-gateway", "", failure, fmt.Sprintf("spaced descriptors %d before, %d during", fdsBefore, fdsDuring))
	c.DeleteSandbox(context.Background(), other)
}

func countFDs(pid int) int {
	e, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	return len(e)
}

// spacedFilesOutside lists regular files spaced holds open outside its home.
func spacedFilesOutside(pid int, home string) []string {
	var out []string
	entries, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	for _, e := range entries {
		l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, e.Name()))
		if err != nil || !strings.HasPrefix(l, "/") || strings.HasPrefix(l, home+"/") || strings.HasPrefix(l, "/dev/") || strings.HasPrefix(l, "/proc/") || strings.HasPrefix(l, "/sys/") {
			continue
		}
		if fi, err := os.Stat(fmt.Sprintf("/proc/%d/fd/%s", pid, e.Name())); err == nil && fi.Mode().IsRegular() {
			out = append(out, l)
		}
	}
	return out
}

// resourcesGroup: exhaustion from inside, judged by spaced answering, other sandboxes working,
// limits holding on the host, and spaced's own memory and files.
func (rt *redTeam) resourcesGroup(t *testing.T) {
	if !rt.full {
		return
	}
	d := rt.rtDaemon(t)
	c, home := d.Client, d.Opts.Home
	other := create(t, c, client.CreateSandboxRequest{Template: "minimal"}).ID
	otherWorks := func() string {
		res, err := sh(c, other, "echo ok", 30*time.Second)
		if err != nil || res.Stdout != "ok\n" {
			return fmt.Sprintf("another sandbox's command failed: %+v %v", res, err)
		}
		return ""
	}
	// Fork bomb.
	{
		id := create(t, c, client.CreateSandboxRequest{Template: "minimal"}).ID
		procsBefore := countProcs()
		sh(c, id, "b() { b | b & }; b", 15*time.Second)
		procsAfter := countProcs()
		var ev string
		if procsAfter-procsBefore > 500 {
			ev = fmt.Sprintf("host processes grew from %d to %d", procsBefore, procsAfter)
		}
		rt.judge(t, "resources", "fork-bomb", ev, joinEv(healthy(c, other), otherWorks()), fmt.Sprintf("host processes %d → %d", procsBefore, procsAfter))
		c.DeleteSandbox(context.Background(), id)
	}
	// Memory: a 256 MiB sandbox grows a string to 1 GiB.
	{
		id := create(t, c, client.CreateSandboxRequest{Template: "minimal", Resources: &client.Resources{MemoryMiB: 256}}).ID
		peak := cgroupPeakWatcher(d.Opts.Instance, id)
		sh(c, id, `awk 'BEGIN { s = "xxxxxxxxxxxxxxxx"; while (length(s) < 1073741824) s = s s; print length(s) }'`, 60*time.Second)
		p := peak()
		var ev string
		if p > 256<<20+64<<20 {
			ev = fmt.Sprintf("the sandbox's cgroup used %d MiB, limit 256 MiB", p>>20)
		}
		rt.judge(t, "resources", "memory-past-limit", ev, joinEv(healthy(c, other), otherWorks()), fmt.Sprintf("peak %d MiB", p>>20))
		c.DeleteSandbox(context.Background(), id)
	}
	// Disk: a 64 MiB sandbox writes 256 MiB.
	{
		id := create(t, c, client.CreateSandboxRequest{Template: "minimal", Resources: &client.Resources{DiskMiB: 64}}).ID
		sh(c, id, "dd if=/dev/zero of=/root/fill bs=1M count=256 2>/dev/null; sync", 90*time.Second)
		used := duBlocks(filepath.Join(home, "runtime", "gvisor", "sandboxes", id, "upper"))
		var ev string
		if used > 64<<20+16<<20 {
			ev = fmt.Sprintf("a sandbox with disk_mib 64 wrote %d MiB to host disk", used>>20)
		}
		rt.judge(t, "resources", "disk-past-limit", ev, joinEv(healthy(c, other, id), otherWorks()), "")
		c.DeleteSandbox(context.Background(), id)
	}
	// Inodes: 20000 files, then a snapshot.
	{
		id := create(t, c, client.CreateSandboxRequest{Template: "minimal"}).ID
		sh(c, id, "mkdir -p /root/i && cd /root/i && seq 1 20000 | xargs touch", 120*time.Second)
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		_, err := c.CreateSnapshot(ctx, id, client.SnapshotFilesystem, "")
		cancel()
		failure, note := opFailure(err)
		rt.judge(t, "resources", "inode-flood-then-snapshot", "", joinEv(failure, healthy(c, other, id), otherWorks()), note)
		c.DeleteSandbox(context.Background(), id)
	}
	// Output flood: 300 MB through a JSON exec; spaced's memory stays bounded and its spool is
	// under SPACE_HOME.
	{
		id := create(t, c, client.CreateSandboxRequest{Template: "minimal"}).ID
		peakRSS(t, d.PID(), true)
		rss0 := peakRSS(t, d.PID(), false)
		done := make(chan struct{})
		var outside []string
		go func() {
			defer close(done)
			sh(c, id, "head -c 300000000 /dev/zero | tr '\\0' y", 3*time.Minute)
		}()
		for i := 0; i < 100; i++ {
			select {
			case <-done:
				i = 100
			case <-time.After(100 * time.Millisecond):
				for _, f := range spacedFilesOutside(d.PID(), home) {
					if !slices.Contains(outside, f) {
						outside = append(outside, f)
					}
				}
			}
		}
		<-done
		rss := peakRSS(t, d.PID(), false)
		var ev []string
		if len(outside) > 0 {
			ev = append(ev, "spaced spooled the sandbox's output to host files outside SPACE_HOME: "+strings.Join(outside, ", "))
		}
		if rss-rss0 > 256<<10 {
			ev = append(ev, fmt.Sprintf("spaced's resident memory grew by %d MiB", (rss-rss0)>>10))
		}
		rt.judge(t, "resources", "output-flood-300MB", strings.Join(ev, "; "), joinEv(healthy(c, other, id), otherWorks()), fmt.Sprintf("spaced peak RSS +%d MiB", (rss-rss0)>>10))
		// A background process whose output nobody reads.
		peakRSS(t, d.PID(), true)
		rss0 = peakRSS(t, d.PID(), false)
		pid, err := c.ExecBackground(context.Background(), id, client.ExecRequest{Command: "yes"})
		if err == nil {
			time.Sleep(10 * time.Second)
			c.Signal(context.Background(), id, pid, "SIGKILL")
		}
		rss = peakRSS(t, d.PID(), false)
		var bev string
		if rss-rss0 > 128<<10 {
			bev = fmt.Sprintf("spaced's resident memory grew by %d MiB", (rss-rss0)>>10)
		}
		rt.judge(t, "resources", "unread-background-output", bev, joinEv(healthy(c, other, id), otherWorks()), fmt.Sprintf("spaced peak RSS +%d MiB", (rss-rss0)>>10))
		c.DeleteSandbox(context.Background(), id)
	}
}

func countProcs() int {
	e, _ := filepath.Glob("/proc/[0-9]*")
	return len(e)
}

// cgroupPeakWatcher samples a sandbox's cgroup memory use every 50 ms; calling the returned
// function stops it and returns the peak (the kernel's own peak where it keeps one).
func cgroupPeakWatcher(instance, id string) func() int64 {
	cg := filepath.Join("space-"+instance, id)
	files := []string{filepath.Join("/sys/fs/cgroup", cg, "memory.current"), filepath.Join("/sys/fs/cgroup/memory", cg, "memory.usage_in_bytes")}
	peaks := []string{filepath.Join("/sys/fs/cgroup", cg, "memory.peak"), filepath.Join("/sys/fs/cgroup/memory", cg, "memory.max_usage_in_bytes")}
	stop := make(chan struct{})
	res := make(chan int64, 1)
	go func() {
		var peak int64
		for {
			for _, f := range append(files, peaks...) {
				if b, err := os.ReadFile(f); err == nil {
					if n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil && n > peak {
						peak = n
					}
				}
			}
			select {
			case <-stop:
				res <- peak
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	return func() int64 { close(stop); return <-res }
}

// duBlocks is the disk space the files under dir take.
func duBlocks(dir string) int64 {
	out, err := exec.Command("du", "-sb", "--apparent-size", dir).Output()
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseInt(strings.Fields(string(out))[0], 10, 64)
	if b, err := exec.Command("du", "-sB1", dir).Output(); err == nil {
		if m, err := strconv.ParseInt(strings.Fields(string(b))[0], 10, 64); err == nil {
			n = m
		}
	}
	return n
}

// credentialsGroup: the admin key, spaced's secrets and a tenant's credential are nowhere a
// sandbox can read them: not its environment, its files, its memory, its checkpoint, nor in the
// clear under SPACE_HOME.
func (rt *redTeam) credentialsGroup(t *testing.T) {
	d := rt.rtDaemon(t)
	c, home := d.Client, d.Opts.Home
	ctx := ctxT(t)
	secret := "RTC-secret-" + spacedtest.RandomHex(12)
	rt.needle("secret", []byte(secret))
	if err := c.PutSecret(ctx, "rtcred", client.PutSecretRequest{Value: secret, Hosts: []string{"allowed.test"}}); err != nil {
		t.Fatal(err)
	}
	id := create(t, c, client.CreateSandboxRequest{Template: "minimal", Network: &client.NetworkSpec{Credentials: []string{"rtcred"}}}).ID
	creds := []string{"secret", "admin-key-env", "environ", "secrets.key", "egress-ca.key"}
	judgeOut := func(name, out string) {
		var ev []string
		for _, n := range rt.found([]byte(out), creds...) {
			ev = append(ev, "canary "+n+" readable in the sandbox")
		}
		rt.judge(t, "credentials", name, strings.Join(ev, "; "), healthy(c, id), "")
	}
	judgeOut("environment", run(t, c, id, "env; cat /proc/[0-9]*/environ | tr '\\0' '\\n'").Stdout)
	judgeOut("files", run(t, c, id, "cat /etc/space/* 2>/dev/null; find / -xdev -type f -size -256k 2>/dev/null | grep -v '^/proc' | head -3000 | xargs cat 2>/dev/null | tr -c '[:print:]\\n' '\\n' | grep -E 'RTC-|e2b_|BEGIN' ; true").Stdout)
	var hostFiles []string
	for _, n := range creds {
		hits := grepTree(t, filepath.Join(home, "runtime", "gvisor", "sandboxes", id), string(rt.needleOf(n)))
		for _, h := range hits {
			if !strings.Contains(h, "/rootfs/") {
				hostFiles = append(hostFiles, n+" in "+h)
			}
		}
	}
	rt.judge(t, "credentials", "sandbox-files-on-host", strings.Join(hostFiles, "; "), "", "")
	// Memory: the checkpoint of the paused sandbox (a control proves the search finds the
	// placeholder it does hold).
	if _, err := c.PauseSandbox(ctx, id); err != nil {
		t.Fatal(err)
	}
	ckpt := filepath.Join(home, "checkpoints", id)
	var mem []string
	for _, n := range creds {
		if hits := grepTree(t, ckpt, string(rt.needleOf(n))); len(hits) > 0 {
			mem = append(mem, n+" in "+strings.Join(hits, ","))
		}
	}
	if len(grepTree(t, ckpt, "space-placeholder-rtcred")) == 0 {
		t.Error("control: the placeholder is not in the checkpoint, so the search proves nothing")
	}
	rt.judge(t, "credentials", "checkpoint-image", strings.Join(mem, "; "), "", "")
	if _, err := c.ResumeSandbox(ctx, id); err != nil {
		t.Fatal(err)
	}
	// The store: the secret and the admin key are in no file under SPACE_HOME in the clear.
	var store []string
	for _, n := range []string{"secret", "admin-key-env"} {
		if hits := grepTree(t, home, string(rt.needleOf(n))); len(hits) > 0 {
			store = append(store, n+" in "+strings.Join(hits, ","))
		}
	}
	rt.judge(t, "credentials", "store-in-the-clear", strings.Join(store, "; "), "", "")
	// API answers a tenant gets never carry the value.
	var api []string
	for _, p := range []string{"/v1/secrets", "/v1/sandboxes/" + id, "/v1/sandboxes"} {
		req, _ := http.NewRequest("GET", d.URL+p, nil)
		req.Header.Set("Authorization", "Bearer "+d.Opts.Key)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if strings.Contains(string(b), secret) {
				api = append(api, "the secret in GET "+p)
			}
		}
	}
	rt.judge(t, "credentials", "api-answers", strings.Join(api, "; "), "", "")
	// The sandbox's host processes (runsc sentry and gofer), the first thing an escape from
	// gVisor reaches, hold no admin key or spaced secrets in their environment.
	var procEnv []string
	for _, p := range processesOf(id) {
		b, _ := os.ReadFile(filepath.Join("/proc", p, "environ"))
		for _, n := range rt.found(b, "admin-key-env", "environ", "secret") {
			procEnv = append(procEnv, fmt.Sprintf("canary %s in the environment of host process %s (%s)", n, p, procName(p)))
		}
	}
	rt.judge(t, "credentials", "runsc-process-environment", strings.Join(procEnv, "; "), "", "")
}

func (rt *redTeam) needleOf(n string) []byte {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return rt.needles[n]
}

// processesOf lists the PIDs of host processes whose command line names sandbox id.
func processesOf(id string) []string {
	var out []string
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, dir := range dirs {
		b, err := os.ReadFile(filepath.Join(dir, "cmdline"))
		if err == nil && strings.Contains(string(b), id) {
			out = append(out, filepath.Base(dir))
		}
	}
	return out
}

func procName(pid string) string {
	f, err := os.Open(filepath.Join("/proc", pid, "cmdline"))
	if err != nil {
		return ""
	}
	defer f.Close()
	s, _ := bufio.NewReader(f).ReadString(0)
	return strings.TrimRight(s, "\x00")
}
