package egress

import "net/netip"

// alwaysBlocked are ranges no policy can open: the sandbox must never reach the host's
// network, other sandboxes or cloud metadata through the gateway.
var alwaysBlocked = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("10.0.0.0/8"),
	netip.MustParsePrefix("100.64.0.0/10"), // CGNAT
	netip.MustParsePrefix("127.0.0.0/8"),
	netip.MustParsePrefix("169.254.0.0/16"), // link-local, cloud metadata
	netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("192.0.0.0/24"),
	netip.MustParsePrefix("192.168.0.0/16"),
	netip.MustParsePrefix("198.18.0.0/15"),
	netip.MustParsePrefix("224.0.0.0/4"), // multicast
	netip.MustParsePrefix("240.0.0.0/4"), // reserved, broadcast
}

// blockedReason says why ip may not be dialled ("" if it may): an always-blocked range, not
// IPv4, or one of extra (the host's own addresses and sandbox links).
func blockedReason(ip netip.Addr, extra []netip.Prefix) string {
	ip = ip.Unmap()
	if !ip.Is4() {
		return "IPv6 is not routed for sandboxes"
	}
	for _, p := range alwaysBlocked {
		if p.Contains(ip) {
			return "address " + ip.String() + " is in " + p.String() + ", which is never reachable"
		}
	}
	for _, p := range extra {
		if p.Contains(ip) {
			return "address " + ip.String() + " belongs to this host"
		}
	}
	return ""
}
