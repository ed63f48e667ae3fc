package gvisor

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/space-sandbox/space/internal/confine"
	"github.com/space-sandbox/space/internal/runtime"
)

const (
	// agentFile is the agent's file name in a sandbox directory and in a checkpoint directory.
	agentFile = "space-agent"
	// AgentGuestPath is where the sandbox sees the agent; it is the sandbox's init. runsc's
	// gofer creates the mount point in the rootfs if the template lacks it, which puts an
	// empty file in the writable layer; templates should contain it.
	AgentGuestPath = "/.space/space-agent"

	defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	cpuPeriodUS = 100000
	// Resources.Pids is enforced twice. Inside, it is the sandbox's RLIMIT_NPROC, which gVisor's
	// kernel applies to every task it starts (the sandbox's root lacks CAP_SYS_ADMIN and
	// CAP_SYS_RESOURCE, so it is bound too): a fork past it fails with EAGAIN and the sandbox
	// lives on. Outside, the host's pids cgroup is the backstop against the sentry itself; it
	// counts the sentry's and gofer's own threads (about 30 idle) and, with systrap, about three
	// host tasks per guest task, hence hostTasksPerPid and pidsHeadroom.
	hostTasksPerPid = 4
	pidsHeadroom    = 128
)

// capabilities of the sandbox's root: Docker's default set, without NET_RAW (raw sockets are
// of no use behind the egress gateway) and with SYS_PTRACE (debuggers; gVisor implements ptrace
// itself). They are gVisor's capabilities, not the host's.
func capabilities() []string {
	return []string{
		"CAP_AUDIT_WRITE", "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID",
		"CAP_KILL", "CAP_MKNOD", "CAP_NET_BIND_SERVICE", "CAP_SETFCAP", "CAP_SETGID",
		"CAP_SETPCAP", "CAP_SETUID", "CAP_SYS_CHROOT", "CAP_SYS_PTRACE",
	}
}

// resources fills zero fields of r from the driver's defaults, then the package defaults.
// DiskMiB, when set, is the size of the sandbox's own file system for its writable layer
// (disk.go); zero leaves the layer on the host's file system, unlimited.
func (d *Driver) resources(r runtime.Resources) runtime.Resources {
	def := d.cfg.Defaults
	pick := func(v, cfg, pkg int64) int64 {
		switch {
		case v > 0:
			return v
		case cfg > 0:
			return cfg
		}
		return pkg
	}
	return runtime.Resources{
		VCPUs:     int(pick(int64(r.VCPUs), int64(def.VCPUs), DefaultVCPUs)),
		MemoryMiB: pick(r.MemoryMiB, def.MemoryMiB, DefaultMemoryMiB),
		Pids:      pick(r.Pids, def.Pids, DefaultPids),
		DiskMiB:   r.DiskMiB,
	}
}

// bundleSpec is the OCI runtime spec of a sandbox whose bundle directory is sb; withBundle says
// whether the template has a system CA bundle for the installation's CA to join.
func (d *Driver) bundleSpec(spec runtime.Spec, sb string, withBundle bool) *specs.Spec {
	env := map[string]string{"PATH": defaultPath, "HOME": "/root"}
	maps.Copy(env, spec.Env)
	if spec.AgentToken != "" {
		env["SPACE_AGENT_TOKEN"] = spec.AgentToken
	}
	var envList []string
	for _, k := range slices.Sorted(maps.Keys(env)) {
		envList = append(envList, k+"="+env[k])
	}
	hostname := spec.Hostname
	if hostname == "" {
		hostname = spec.ID
	}

	res := d.resources(spec.Resources)
	memory := res.MemoryMiB << 20
	quota := int64(res.VCPUs) * cpuPeriodUS
	period := uint64(cpuPeriodUS)

	netns := specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: spec.Network.NetNSPath}
	caps := capabilities()
	out := &specs.Spec{
		Version: specs.Version,
		Process: &specs.Process{
			Args: []string{AgentGuestPath},
			Env:  envList,
			Cwd:  "/",
			User: specs.User{UID: 0, GID: 0},
			Capabilities: &specs.LinuxCapabilities{
				Bounding: caps, Effective: caps, Permitted: caps,
			},
			Rlimits: []specs.POSIXRlimit{
				{Type: "RLIMIT_NOFILE", Hard: 1 << 20, Soft: 1 << 20},
				{Type: "RLIMIT_NPROC", Hard: uint64(res.Pids), Soft: uint64(res.Pids)},
			},
		},
		Root:     &specs.Root{Path: filepath.Join(sb, "rootfs")},
		Hostname: hostname,
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
			{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777"}},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
			// Without a mount at /tmp, runsc puts a tmpfs on an empty /tmp. The sandbox's /tmp
			// must stay part of its writable layer (on disk, in file snapshots), so bind the
			// rootfs's own /tmp over itself.
			{Destination: "/tmp", Type: "bind", Source: filepath.Join(sb, "rootfs", "tmp"), Options: []string{"bind", "rw", "nosuid", "nodev"}},
			{Destination: AgentGuestPath, Type: "bind", Source: filepath.Join(sb, agentFile), Options: []string{"bind", "ro"}},
			{Destination: "/etc/resolv.conf", Type: "bind", Source: filepath.Join(sb, resolvFile), Options: []string{"bind", "ro"}},
		},
		Linux: &specs.Linux{
			CgroupsPath: d.cgroupParent() + "/" + spec.ID,
			Resources: &specs.LinuxResources{
				Memory: d.memoryLimit(memory),
				CPU:    &specs.LinuxCPU{Quota: &quota, Period: &period},
				Pids:   &specs.LinuxPids{Limit: res.Pids*hostTasksPerPid + pidsHeadroom},
			},
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace},
				{Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace},
				{Type: specs.MountNamespace},
				netns,
			},
		},
	}
	if len(spec.CACert) > 0 {
		out.Mounts = append(out.Mounts,
			specs.Mount{Destination: "/etc/space/ca.crt", Type: "bind", Source: filepath.Join(sb, caFile), Options: []string{"bind", "ro"}},
			specs.Mount{Destination: "/etc/space/ca-bundle.crt", Type: "bind", Source: filepath.Join(sb, caBundleFile), Options: []string{"bind", "ro"}})
		if withBundle {
			out.Mounts = append(out.Mounts, specs.Mount{Destination: "/" + systemBundlePath, Type: "bind", Source: filepath.Join(sb, caBundleFile), Options: []string{"bind", "ro"}})
		}
	}
	return out
}

// The files of an installed CA in a sandbox directory, and the distribution bundle it joins.
const (
	caFile           = "ca.crt"
	caBundleFile     = "ca-bundle.crt"
	systemBundlePath = "etc/ssl/certs/ca-certificates.crt"
)

// bundleLimit bounds the system CA bundle read from a template (Debian's is about 220 KB).
const bundleLimit = 8 << 20

// writeCA writes the sandbox's CA files: the certificate, and the system bundle of the merged
// root rootfs with it appended. The root is the template and the sandbox's own writable layer,
// so the bundle is read through confine: a link planted there is no bundle (the sandbox then
// gets the installation's CA alone), never a host file. It reports whether a bundle was found.
func writeCA(sb, rootfs string, spec runtime.Spec) (bool, error) {
	if len(spec.CACert) == 0 {
		return false, nil
	}
	//confine:host a file of the sandbox directory, which only the driver writes
	if err := os.WriteFile(filepath.Join(sb, caFile), spec.CACert, 0o644); err != nil {
		return false, err
	}
	root, err := confine.Open(rootfs)
	if err != nil {
		return false, err
	}
	defer root.Close()
	var bundle []byte
	found := false
	if b, err := root.ReadFile(systemBundlePath, bundleLimit); err == nil {
		bundle, found = append(b, '\n'), true
	}
	//confine:host a file of the sandbox directory, which only the driver writes
	return found, os.WriteFile(filepath.Join(sb, caBundleFile), append(bundle, spec.CACert...), 0o644)
}

// ensureMountPoints makes sure every place the bundle mounts something over inside the sandbox's
// root is a real directory or file whose every ancestor is a real directory, not a link the
// image or the sandbox planted: runsc resolves bind-mount sources on the host, and /tmp's source
// lies inside the root. Whatever else is there is replaced (in the writable layer).
func ensureMountPoints(rootfs string, spec runtime.Spec, withBundle bool) error {
	root, err := confine.Open(rootfs)
	if err != nil {
		return err
	}
	defer root.Close()
	if err := root.EnsureDir("tmp", 0o1777); err != nil {
		return fmt.Errorf("mount point /tmp: %w", err)
	}
	files := []string{strings.TrimPrefix(AgentGuestPath, "/"), "etc/resolv.conf"}
	if len(spec.CACert) > 0 {
		files = append(files, "etc/space/ca.crt", "etc/space/ca-bundle.crt")
		if withBundle {
			files = append(files, systemBundlePath)
		}
	}
	for _, f := range files {
		if err := root.EnsureFile(f, 0o644); err != nil {
			return fmt.Errorf("mount point /%s: %w", f, err)
		}
	}
	return nil
}

// memoryLimit is the cgroup memory setting for limit bytes: with swap on the host, memory and
// swap together (a sandbox must not go past its memory_mib into swap).
func (d *Driver) memoryLimit(limit int64) *specs.LinuxMemory {
	m := &specs.LinuxMemory{Limit: &limit}
	if d.limitSwap {
		m.Swap = &limit
	}
	return m
}

// swapAccounted reports whether the host has swap in use and cgroups that limit it: on v1 the
// memsw files (swapaccount=1), on v2 memory.swap.max in child groups. Without swap there is
// nothing to limit, and without accounting runsc could not apply a swap limit.
func swapAccounted() bool {
	//confine:host the host's /proc
	b, err := os.ReadFile("/proc/swaps")
	if err != nil || len(strings.Split(strings.TrimSpace(string(b)), "\n")) < 2 {
		return false
	}
	//confine:host the host's cgroup file system
	if _, err := os.Stat("/sys/fs/cgroup/memory/memory.memsw.limit_in_bytes"); err == nil {
		return true
	}
	//confine:host the host's cgroup file system
	m, _ := filepath.Glob("/sys/fs/cgroup/*/memory.swap.max")
	return len(m) > 0
}
