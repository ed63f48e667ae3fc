package network

import (
	"errors"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/space-sandbox/space/internal/errdefs"
)

func TestConfigDefaults(t *testing.T) {
	tests := []struct {
		name    string
		in      Config
		want    Config // Logger not compared
		wantErr error
	}{
		{
			name: "defaults",
			in:   Config{Instance: "1a2b"},
			want: Config{Instance: "1a2b", CIDR: DefaultCIDR, LeaseDir: DefaultLeaseDir, PoolSize: DefaultPoolSize},
		},
		{
			name: "explicit, masked, no pool",
			in:   Config{Instance: "00ff", CIDR: netip.MustParsePrefix("10.1.2.3/24"), LeaseDir: "/x", PoolSize: -1},
			want: Config{Instance: "00ff", CIDR: netip.MustParsePrefix("10.1.2.0/24"), LeaseDir: "/x", PoolSize: 0},
		},
		{name: "empty instance", in: Config{}, wantErr: errdefs.ErrInvalidArgument},
		{name: "upper-case instance", in: Config{Instance: "1A2B"}, wantErr: errdefs.ErrInvalidArgument},
		{name: "long instance", in: Config{Instance: "1a2b3"}, wantErr: errdefs.ErrInvalidArgument},
		{name: "ipv6 cidr", in: Config{Instance: "1a2b", CIDR: netip.MustParsePrefix("fd00::/64")}, wantErr: errdefs.ErrInvalidArgument},
		{name: "cidr too small", in: Config{Instance: "1a2b", CIDR: netip.MustParsePrefix("10.0.0.0/31")}, wantErr: errdefs.ErrInvalidArgument},
		{name: "cidr too large", in: Config{Instance: "1a2b", CIDR: netip.MustParsePrefix("10.0.0.0/7")}, wantErr: errdefs.ErrInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.in.withDefaults()
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("withDefaults() error = %v, want %v", err, tt.wantErr)
			}
			if err != nil {
				return
			}
			if got.Logger == nil {
				t.Error("Logger is nil")
			}
			got.Logger = nil
			if diff := cmp.Diff(tt.want, got, cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); diff != "" {
				t.Errorf("withDefaults() (-want +got):\n%s", diff)
			}
		})
	}
}

func TestSlotLayout(t *testing.T) {
	cidr := netip.MustParsePrefix("10.211.0.0/16")
	tests := []struct {
		index int
		host  string
		guest string
	}{
		{0, "10.211.0.1", "10.211.0.2/30"},
		{1, "10.211.0.5", "10.211.0.6/30"},
		{64, "10.211.1.1", "10.211.1.2/30"},
		{16383, "10.211.255.253", "10.211.255.254/30"},
	}
	for _, tt := range tests {
		host, guest := slotAddrs(cidr, tt.index)
		if host.String() != tt.host || guest.String() != tt.guest {
			t.Errorf("slotAddrs(%d) = %s, %s; want %s, %s", tt.index, host, guest, tt.host, tt.guest)
		}
		for _, a := range []netip.Addr{host, guest.Addr(), guest.Masked().Addr()} {
			if i, ok := slotIndexOf(cidr, a); !ok || i != tt.index {
				t.Errorf("slotIndexOf(%s) = %d, %v; want %d", a, i, ok, tt.index)
			}
		}
	}
	if _, ok := slotIndexOf(cidr, netip.MustParseAddr("10.212.0.1")); ok {
		t.Error("slotIndexOf accepted an address outside the CIDR")
	}
}

func TestNames(t *testing.T) {
	// The largest index a /8 allows must still give a valid interface name (IFNAMSIZ-1 = 15).
	maxIndex := 1<<(30-8) - 1
	if n := hostIfName("ffff", maxIndex); len(n) > 15 {
		t.Errorf("hostIfName(ffff, %d) = %q: %d bytes, want <= 15", maxIndex, n, len(n))
	}
	if got := netnsName("1a2b", 7); got != "space-1a2b-7" {
		t.Errorf("netnsName = %q", got)
	}
	tests := []struct {
		name   string
		inst   string
		index  int
		wantOK bool
	}{
		{"sp1a2bh7", "1a2b", 7, true},
		{"sp1a2bh12345", "1a2b", 12345, true},
		{"sp1a2bh07", "", 0, false}, // not canonical
		{"sp1a2bh", "", 0, false},
		{"sp1A2Bh7", "", 0, false},
		{"eth0", "", 0, false},
		{"sp1a2bx7", "", 0, false},
	}
	for _, tt := range tests {
		inst, i, ok := parseHostIf(tt.name)
		if ok != tt.wantOK || inst != tt.inst || i != tt.index {
			t.Errorf("parseHostIf(%q) = %q, %d, %v; want %q, %d, %v", tt.name, inst, i, ok, tt.inst, tt.index, tt.wantOK)
		}
	}
}

func TestLeases(t *testing.T) {
	dir := t.TempDir()
	const n = 3
	// Two instances share the directory: every index is taken once.
	got := map[int]string{}
	for _, inst := range []string{"aaaa", "bbbb", "aaaa"} {
		i, err := takeLease(dir, inst, 0, n)
		if err != nil {
			t.Fatalf("takeLease(%s): %v", inst, err)
		}
		if prev, dup := got[i]; dup {
			t.Fatalf("index %d given to %s and %s", i, prev, inst)
		}
		got[i] = inst
	}
	if _, err := takeLease(dir, "bbbb", 0, n); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("takeLease on a full range: %v, want ErrResourceExhausted", err)
	}
	for i, inst := range got {
		l, err := readLease(dir, i)
		if err != nil || l != (lease{owner: inst, state: leasePool}) {
			t.Errorf("readLease(%d) = %+v, %v; want owner %s, pool", i, l, err, inst)
		}
	}

	if err := setLeaseState(dir, got[0], 0, leaseUsed); err != nil {
		t.Fatal(err)
	}
	if l, _ := readLease(dir, 0); l.state != leaseUsed {
		t.Errorf("state after setLeaseState = %q, want used", l.state)
	}
	// Dropping someone else's lease is a no-op; dropping one's own removes it.
	other := "aaaa"
	if got[1] == "aaaa" {
		other = "bbbb"
	}
	if err := dropLease(dir, other, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := readLease(dir, 1); err != nil {
		t.Errorf("lease 1 dropped by a non-owner: %v", err)
	}
	if err := dropLease(dir, got[1], 1); err != nil {
		t.Fatal(err)
	}
	if _, err := readLease(dir, 1); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("lease 1 after drop: %v, want not exist", err)
	}
	// The freed index is found again, starting the search past it.
	if i, err := takeLease(dir, "bbbb", 2, n); err != nil || i != 1 {
		t.Errorf("takeLease after drop = %d, %v; want 1", i, err)
	}
	// No temporary files are left behind.
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") {
			t.Errorf("leftover temporary file %s", filepath.Join(dir, e.Name()))
		}
	}
}

func TestParseLease(t *testing.T) {
	tests := []struct {
		in      string
		want    lease
		wantErr bool
	}{
		{"1a2b\nused\n", lease{"1a2b", leaseUsed}, false},
		{"1a2b\npool\n", lease{"1a2b", leasePool}, false},
		{"1a2b\n", lease{"1a2b", ""}, false},
		{"", lease{}, true},
		{"zzzz\nused\n", lease{}, true},
	}
	for _, tt := range tests {
		got, err := parseLease([]byte(tt.in))
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("parseLease(%q) = %+v, %v; want %+v, err %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}
