package network

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// slotAddrs returns the host address (.1) and guest address (.2/30) of the i-th /30 of cidr.
func slotAddrs(cidr netip.Prefix, i int) (host netip.Addr, guest netip.Prefix) {
	base := addrToU32(cidr.Masked().Addr()) + uint32(i)*4
	return u32ToAddr(base + 1), netip.PrefixFrom(u32ToAddr(base+2), 30)
}

// slotIndexOf returns the index of the /30 of cidr that holds a, or false if a is outside cidr.
func slotIndexOf(cidr netip.Prefix, a netip.Addr) (int, bool) {
	if !a.Is4() || !cidr.Contains(a) {
		return 0, false
	}
	return int((addrToU32(a) - addrToU32(cidr.Masked().Addr())) / 4), true
}

func addrToU32(a netip.Addr) uint32 {
	b := a.As4()
	return binary.BigEndian.Uint32(b[:])
}

func u32ToAddr(v uint32) netip.Addr {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], v)
	return netip.AddrFrom4(b)
}

// netnsName is the name of slot i's netns: "space-<inst>-<i>".
func netnsName(inst string, i int) string { return fmt.Sprintf("space-%s-%d", inst, i) }

// hostIfName is the name of slot i's host-side veth: "sp<inst>h<i>" (at most 15 bytes for the
// indexes a /8 allows).
func hostIfName(inst string, i int) string { return fmt.Sprintf("sp%sh%d", inst, i) }

// hostIfPrefix is the common prefix of the instance's host veth names.
func hostIfPrefix(inst string) string { return "sp" + inst + "h" }

// parseIndexed parses name as prefix followed by a canonical decimal index.
func parseIndexed(name, prefix string) (int, bool) {
	rest, ok := strings.CutPrefix(name, prefix)
	if !ok {
		return 0, false
	}
	return parseIndex(rest)
}

// parseIndex parses a canonical non-negative decimal (no sign, no leading zeros).
func parseIndex(s string) (int, bool) {
	i, err := strconv.Atoi(s)
	if err != nil || i < 0 || strconv.Itoa(i) != s {
		return 0, false
	}
	return i, true
}

// parseHostIf splits any spaced host veth name "sp<inst>h<i>" into instance and index.
func parseHostIf(name string) (inst string, i int, ok bool) {
	if len(name) < 8 || !strings.HasPrefix(name, "sp") || name[6] != 'h' {
		return "", 0, false
	}
	inst = name[2:6]
	if !instanceRE.MatchString(inst) {
		return "", 0, false
	}
	if i, ok = parseIndex(name[7:]); !ok {
		return "", 0, false
	}
	return inst, i, true
}
