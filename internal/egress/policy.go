// Package egress is the gateway every sandbox's traffic out goes through: a DNS server that
// answers only names the sandbox's policy allows (and never forwards the others), and a
// transparent TCP proxy that decides by the name the connection carries (TLS SNI or HTTP Host),
// never by the address the sandbox chose, resolves that name itself and refuses private,
// loopback, link-local, CGNAT, multicast and the host's own addresses after resolution. Every
// decision is recorded per sandbox (Audit).
package egress

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// Rule is one entry of an allow or deny list: a host name (exact, or "*.example.com" for every
// name below example.com), or a CIDR, optionally with ":port".
type Rule struct {
	Host   string       // lower case, no trailing dot; "*."-prefixed for a wildcard; "" for a CIDR rule
	Prefix netip.Prefix // valid for a CIDR rule
	Port   uint16       // 0: any port
}

// ParseRule parses "name", "*.name", "cidr" or any of them followed by ":port".
func ParseRule(s string) (Rule, error) {
	s = strings.ToLower(strings.TrimSpace(s))
	var r Rule
	body := s
	if i := strings.LastIndexByte(s, ':'); i >= 0 {
		p, err := strconv.ParseUint(s[i+1:], 10, 16)
		if err != nil || p == 0 {
			return Rule{}, fmt.Errorf("%q: bad port", s)
		}
		r.Port, body = uint16(p), s[:i]
	}
	if strings.ContainsRune(body, '/') {
		pfx, err := netip.ParsePrefix(body)
		if err != nil || !pfx.Addr().Is4() {
			return Rule{}, fmt.Errorf("%q: not an IPv4 CIDR", s)
		}
		r.Prefix = pfx.Masked()
		return r, nil
	}
	name := strings.TrimSuffix(body, ".")
	if ip, err := netip.ParseAddr(name); err == nil {
		if !ip.Is4() {
			return Rule{}, fmt.Errorf("%q: only IPv4 addresses", s)
		}
		r.Prefix = netip.PrefixFrom(ip, 32)
		return r, nil
	}
	if !validName(strings.TrimPrefix(name, "*.")) {
		return Rule{}, fmt.Errorf("%q: not a host name, *.wildcard or CIDR", s)
	}
	r.Host = name
	return r, nil
}

// validName reports whether s is a DNS host name (letters, digits, hyphens; labels up to 63).
func validName(s string) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	for _, label := range strings.Split(s, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

// NormalizeName lower-cases a name and drops a trailing dot; it returns "" for anything that
// is not a host name.
func NormalizeName(s string) string {
	s = strings.TrimSuffix(strings.ToLower(s), ".")
	if !validName(s) {
		return ""
	}
	return s
}

func (r Rule) matches(host string, ip netip.Addr, port uint16) bool {
	if r.Port != 0 && r.Port != port {
		return false
	}
	if r.Host == "" {
		return ip.IsValid() && r.Prefix.Contains(ip)
	}
	if host == "" {
		return false
	}
	if suffix, ok := strings.CutPrefix(r.Host, "*."); ok {
		return strings.HasSuffix(host, "."+suffix)
	}
	return host == r.Host
}

// ParseRules parses a list of rules (see ParseRule).
func ParseRules(list []string) ([]Rule, error) {
	var out []Rule
	for _, s := range list {
		r, err := ParseRule(s)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// Policy is one sandbox's egress policy.
type Policy struct {
	Default string // "allow" or "deny"
	Allow   []Rule
	Deny    []Rule
}

// NewPolicy parses a policy; def must be "allow" or "deny".
func NewPolicy(def string, allow, deny []string) (Policy, error) {
	p := Policy{Default: def}
	if def != "allow" && def != "deny" {
		return Policy{}, fmt.Errorf("default %q: want allow or deny", def)
	}
	for _, list := range []struct {
		in  []string
		out *[]Rule
	}{{allow, &p.Allow}, {deny, &p.Deny}} {
		for _, s := range list.in {
			r, err := ParseRule(s)
			if err != nil {
				return Policy{}, err
			}
			*list.out = append(*list.out, r)
		}
	}
	return p, nil
}

// Decide says whether a connection to host (a normalized name, or "" when the connection
// names none) at ip (invalid if not known yet) and port may go, and why. Deny rules win over
// allow rules, which win over the default.
func (p Policy) Decide(host string, ip netip.Addr, port uint16) (bool, string) {
	for _, r := range p.Deny {
		if r.matches(host, ip, port) {
			return false, "denied by rule " + r.String()
		}
	}
	for _, r := range p.Allow {
		if r.matches(host, ip, port) {
			return true, "allowed by rule " + r.String()
		}
	}
	if p.Default == "allow" {
		return true, "allowed by default"
	}
	return false, "not in the allow list (default deny)"
}

// DenyAddr says whether a deny rule by address refuses ip at port, and which: applied to the
// addresses a named connection resolves to, so that a CIDR deny cannot be bypassed by naming
// the host instead of its address. Port 0 (a DNS answer) is refused only by port-less rules.
func (p Policy) DenyAddr(ip netip.Addr, port uint16) (bool, string) {
	ip = ip.Unmap()
	for _, r := range p.Deny {
		if r.Host != "" || !r.Prefix.Contains(ip) {
			continue
		}
		if r.Port == 0 || r.Port == port {
			return true, "address " + ip.String() + " denied by rule " + r.String()
		}
	}
	return false, ""
}

// MayResolve reports whether a name may be looked up at all: some port of it could be allowed.
// A name no rule could allow is never resolved (so never leaves the gateway).
func (p Policy) MayResolve(host string) bool {
	for _, r := range p.Deny {
		if r.Port == 0 && r.Host != "" && r.matches(host, netip.Addr{}, 0) {
			return false
		}
	}
	for _, r := range p.Allow {
		if r.Host != "" && r.matches(host, netip.Addr{}, r.Port) {
			return true
		}
	}
	return p.Default == "allow"
}

func (r Rule) String() string {
	s := r.Host
	if s == "" {
		s = r.Prefix.String()
	}
	if r.Port != 0 {
		s += ":" + strconv.Itoa(int(r.Port))
	}
	return s
}
