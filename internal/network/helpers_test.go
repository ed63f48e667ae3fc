package network

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/space-sandbox/space/internal/errdefs"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// abandon stops the pool's background work and leaves everything it made in place, as a crash
// of spaced would.
func (p *Pool) abandon() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.stop()
	<-p.done
	p.ops.Wait()
}

// freeIndexes returns the indexes of the prepared slots.
func (p *Pool) freeIndexes() []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []int
	for _, s := range p.free {
		out = append(out, s.Index)
	}
	return out
}

// waitPrepared waits until the pool holds n prepared slots.
func waitPrepared(tb testing.TB, p *Pool, n int) {
	tb.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for len(p.freeIndexes()) < n {
		if time.Now().After(deadline) {
			tb.Fatalf("pool did not prepare %d slots in time (has %v)", n, p.freeIndexes())
		}
		time.Sleep(time.Millisecond)
	}
}

// testConfig returns a config with a random instance, a random /24 of 10.213.0.0/16 and a
// temporary lease directory, so that parallel tests and runs do not collide.
func testConfig(tb testing.TB) Config {
	return Config{
		Instance: fmt.Sprintf("%04x", rand.IntN(1<<16)),
		CIDR:     randomCIDR(),
		LeaseDir: tb.TempDir(),
		PoolSize: 2,
		Logger:   slog.New(slog.NewTextHandler(testWriter{tb}, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
}

func randomCIDR() netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 213, byte(rand.IntN(256)), 0}), 24)
}

type testWriter struct{ tb testing.TB }

func (w testWriter) Write(b []byte) (int, error) {
	w.tb.Log(strings.TrimSuffix(string(b), "\n"))
	return len(b), nil
}

// newTestPool creates a pool for cfg, picking another random CIDR if the host already uses this
// one, and removes everything of its instance when the test ends.
func newTestPool(tb testing.TB, cfg Config) *Pool {
	tb.Helper()
	var p *Pool
	var err error
	for range 10 {
		p, err = NewPool(context.Background(), cfg)
		if !errors.Is(err, errdefs.ErrFailedPrecondition) {
			break
		}
		cfg.CIDR = randomCIDR()
	}
	if err != nil {
		tb.Fatalf("NewPool: %v", err)
	}
	tb.Cleanup(func() {
		p.Close(context.Background())
		for _, r := range residue(tb, cfg.Instance, cfg.LeaseDir) {
			tb.Logf("cleanup: removing leftover %s", r)
		}
		forceCleanup(tb, cfg.Instance, cfg.LeaseDir)
	})
	return p
}

// residue lists what of instance inst exists on the host: netns, veths, leases, temporary lease
// files and the nftables table.
func residue(tb testing.TB, inst, leaseDir string) []string {
	tb.Helper()
	var out []string
	nsEnts, err := os.ReadDir(netnsDir)
	if err != nil {
		tb.Fatal(err)
	}
	for _, e := range nsEnts {
		if strings.HasPrefix(e.Name(), "space-"+inst+"-") {
			out = append(out, "netns "+e.Name())
		}
	}
	links, err := netlink.LinkList()
	if err != nil {
		tb.Fatal(err)
	}
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Name, hostIfPrefix(inst)) {
			out = append(out, "link "+l.Attrs().Name)
		}
	}
	leaseEnts, err := os.ReadDir(leaseDir)
	if err != nil {
		tb.Fatal(err)
	}
	for _, e := range leaseEnts {
		if strings.HasPrefix(e.Name(), tmpPrefix(inst)) {
			out = append(out, "temp file "+e.Name())
			continue
		}
		if b, err := os.ReadFile(filepath.Join(leaseDir, e.Name())); err == nil {
			if l, err := parseLease(b); err == nil && l.owner == inst {
				out = append(out, "lease "+e.Name())
			}
		}
	}
	if hasTable(tb, inst) {
		out = append(out, "nft table "+tableName(inst))
	}
	return out
}

func hasTable(tb testing.TB, inst string) bool {
	tb.Helper()
	c, err := nftables.New()
	if err != nil {
		tb.Fatal(err)
	}
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		tb.Fatal(err)
	}
	for _, t := range tables {
		if t.Name == tableName(inst) {
			return true
		}
	}
	return false
}

// forceCleanup removes everything residue lists.
func forceCleanup(tb testing.TB, inst, leaseDir string) {
	nsEnts, _ := os.ReadDir(netnsDir)
	for _, e := range nsEnts {
		if strings.HasPrefix(e.Name(), "space-"+inst+"-") {
			removeNetNS(filepath.Join(netnsDir, e.Name()))
		}
	}
	links, _ := netlink.LinkList()
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Name, hostIfPrefix(inst)) {
			netlink.LinkDel(l)
		}
	}
	leaseEnts, _ := os.ReadDir(leaseDir)
	for _, e := range leaseEnts {
		path := filepath.Join(leaseDir, e.Name())
		if strings.HasPrefix(e.Name(), tmpPrefix(inst)) {
			os.Remove(path)
		} else if b, err := os.ReadFile(path); err == nil {
			if l, err := parseLease(b); err == nil && l.owner == inst {
				os.Remove(path)
			}
		}
	}
	if err := removeRules(inst); err != nil {
		tb.Errorf("cleanup: %v", err)
	}
}

func assertNoResidue(tb testing.TB, inst, leaseDir string) {
	tb.Helper()
	if r := residue(tb, inst, leaseDir); len(r) > 0 {
		tb.Errorf("instance %s left on the host: %v", inst, r)
	}
}

// inNetNS runs f on an OS thread that has entered the netns at path. Sockets f creates stay in
// that netns whatever thread uses them later. The thread is never returned to the runtime.
func inNetNS(path string, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
		fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			errc <- err
			return
		}
		err = unix.Setns(fd, unix.CLONE_NEWNET)
		unix.Close(fd)
		if err != nil {
			errc <- fmt.Errorf("setns %s: %w", path, err)
			return
		}
		errc <- f()
	}()
	return <-errc
}

// ping sends one ICMP echo request to dst from the calling thread's netns and reports whether a
// reply from dst arrived within timeout.
func ping(dst netip.Addr, timeout time.Duration) (bool, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_ICMP)
	if err != nil {
		return false, err
	}
	defer unix.Close(fd)
	tv := unix.NsecToTimeval(int64(timeout))
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return false, err
	}
	id := uint16(rand.IntN(1 << 16))
	pkt := []byte{8, 0, 0, 0, byte(id >> 8), byte(id), 0, 1, 's', 'p', 'a', 'c', 'e', 0}
	binary.BigEndian.PutUint16(pkt[2:], icmpChecksum(pkt))
	if err := unix.Sendto(fd, pkt, 0, &unix.SockaddrInet4{Addr: dst.As4()}); err != nil {
		return false, err
	}
	buf := make([]byte, 1500)
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		n, from, err := unix.Recvfrom(fd, buf, 0)
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return false, err
		}
		src, ok := from.(*unix.SockaddrInet4)
		if !ok || src.Addr != dst.As4() || n < 20 {
			continue
		}
		ihl := int(buf[0]&0x0f) * 4
		icmp := buf[ihl:n]
		if len(icmp) >= 8 && icmp[0] == 0 && binary.BigEndian.Uint16(icmp[4:]) == id {
			return true, nil
		}
	}
	return false, nil
}

func icmpChecksum(b []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}
