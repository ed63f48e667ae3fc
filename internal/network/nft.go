package network

import (
	"errors"
	"fmt"
	"io/fs"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// The instance's nftables table, "inet space_<inst>", matches the instance's host veths by name
// prefix (iifname/oifname "sp<inst>h*"), so it never changes when slots come and go. It holds:
//
//	chain input   { type filter hook input priority -300; iifname "sp<inst>h*" jump sandbox_in }
//	chain sandbox_in {
//	    fib saddr . iif oif missing drop           # source not routed back through this veth: spoofed
//	    ct state established,related accept       # replies to the host's own connections
//	    drop                                       # everything else, any port, any address, IPv6 too
//	}
//	chain forward { type filter hook forward priority -300;
//	                iifname "sp<inst>h*" drop; oifname "sp<inst>h*" drop }
//
// With an egress gateway (GatewayPorts), sandbox traffic out is redirected to it and admitted:
//
//	chain prerouting { type nat hook prerouting priority -100;
//	    iifname "sp<inst>h*" meta nfproto ipv4 meta l4proto tcp redirect to :<proxy>
//	    iifname "sp<inst>h*" meta nfproto ipv4 meta l4proto udp th dport 53 redirect to :<dns> }
//	sandbox_in, before its final drop:
//	    meta nfproto ipv4 meta l4proto tcp th dport <proxy> accept
//	    meta nfproto ipv4 meta l4proto udp th dport <dns> accept
//	input, first: iifname != "sp<inst>h*" th dport <proxy|dns> drop   # the gateway serves sandboxes only
//
// Every other packet from a sandbox is still dropped: UDP but DNS (QUIC too), ICMP, IPv6, and
// anything routed towards another host or sandbox (forward).
//
// A drop in any base chain is final whatever other tables say, while an accept only ends this
// table's verdict; so a permissive host ruleset cannot open what this table closes. The early
// priority only makes the drop happen before other tables' chains spend time on the packet;
// conntrack has already classified the packet in prerouting, so "ct state" is valid here.
// The table is inet, so IPv4 and IPv6 are both covered; non-IP traffic never reaches these
// hooks (ARP is answered by the kernel and is harmless).

const (
	chainSandboxIn = "sandbox_in"
	rulePriority   = -300
)

func tableName(inst string) string { return "space_" + inst }

// GatewayPorts are the host ports of an instance's egress gateway.
type GatewayPorts struct {
	Proxy uint16 // transparent TCP proxy
	DNS   uint16 // DNS server (UDP)
}

// installRules creates or atomically replaces the instance's table.
func installRules(inst string, gw *GatewayPorts) error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	t := &nftables.Table{Family: nftables.TableFamilyINet, Name: tableName(inst)}
	// add + delete + add in one transaction: the table is replaced whether or not it existed,
	// and no packet ever sees it missing.
	c.AddTable(t)
	c.DelTable(t)
	c.AddTable(t)

	accept := nftables.ChainPolicyAccept
	prio := nftables.ChainPriorityRef(rulePriority)
	sbIn := c.AddChain(&nftables.Chain{Name: chainSandboxIn, Table: t})
	input := c.AddChain(&nftables.Chain{
		Name: "input", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: prio, Policy: &accept,
	})
	forward := c.AddChain(&nftables.Chain{
		Name: "forward", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: prio, Policy: &accept,
	})

	prefix := []byte(hostIfPrefix(inst))
	zero := make([]byte, 4)
	c.AddRule(&nftables.Rule{Table: t, Chain: input, Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: prefix}, // compares len(prefix) bytes: a wildcard
		&expr.Verdict{Kind: expr.VerdictJump, Chain: chainSandboxIn},
	}})
	c.AddRule(&nftables.Rule{Table: t, Chain: sbIn, Exprs: []expr.Any{
		&expr.Fib{Register: 1, FlagSADDR: true, FlagIIF: true, ResultOIF: true},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: zero},
		&expr.Counter{},
		&expr.Verdict{Kind: expr.VerdictDrop},
	}})
	c.AddRule(&nftables.Rule{Table: t, Chain: sbIn, Exprs: []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{
			SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED),
			Xor:  zero,
		},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: zero},
		&expr.Verdict{Kind: expr.VerdictAccept},
	}})
	if gw != nil {
		addGatewayRules(c, t, input, sbIn, prefix, gw)
	}
	c.AddRule(&nftables.Rule{Table: t, Chain: sbIn, Exprs: []expr.Any{
		&expr.Counter{},
		&expr.Verdict{Kind: expr.VerdictDrop},
	}})
	for _, key := range []expr.MetaKey{expr.MetaKeyIIFNAME, expr.MetaKeyOIFNAME} {
		c.AddRule(&nftables.Rule{Table: t, Chain: forward, Exprs: []expr.Any{
			&expr.Meta{Key: key, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: prefix},
			&expr.Counter{},
			&expr.Verdict{Kind: expr.VerdictDrop},
		}})
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nftables: install table %s: %w", t.Name, err)
	}
	return nil
}

// matchL4 loads "meta nfproto ipv4 meta l4proto proto" checks, and a destination port check
// when port is not 0.
func matchL4(proto byte, port uint16) []expr.Any {
	out := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
	}
	if port != 0 {
		out = append(out,
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(port)},
		)
	}
	return out
}

// addGatewayRules redirects sandbox TCP and DNS to the gateway and admits them (see the top).
func addGatewayRules(c *nftables.Conn, t *nftables.Table, input, sbIn *nftables.Chain, prefix []byte, gw *GatewayPorts) {
	nat := c.AddChain(&nftables.Chain{
		Name: "prerouting", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest,
	})
	fromSandbox := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: prefix},
	}
	redirect := func(port uint16) []expr.Any {
		return []expr.Any{
			&expr.Immediate{Register: 1, Data: binaryutil.BigEndian.PutUint16(port)},
			&expr.Redir{RegisterProtoMin: 1},
		}
	}
	rule := func(chain *nftables.Chain, parts ...[]expr.Any) {
		var exprs []expr.Any
		for _, p := range parts {
			exprs = append(exprs, p...)
		}
		c.AddRule(&nftables.Rule{Table: t, Chain: chain, Exprs: exprs})
	}
	rule(nat, fromSandbox, matchL4(unix.IPPROTO_TCP, 0), redirect(gw.Proxy))
	rule(nat, fromSandbox, matchL4(unix.IPPROTO_UDP, 53), redirect(gw.DNS))
	accept := []expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}}
	rule(sbIn, matchL4(unix.IPPROTO_TCP, gw.Proxy), accept)
	rule(sbIn, matchL4(unix.IPPROTO_UDP, gw.DNS), accept)
	// Nobody else may use the gateway (it listens on every host address).
	notSandbox := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: prefix},
	}
	drop := []expr.Any{&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictDrop}}
	insertFirst := func(parts ...[]expr.Any) {
		var exprs []expr.Any
		for _, p := range parts {
			exprs = append(exprs, p...)
		}
		c.InsertRule(&nftables.Rule{Table: t, Chain: input, Exprs: exprs})
	}
	insertFirst(notSandbox, matchL4(unix.IPPROTO_TCP, gw.Proxy), drop)
	insertFirst(notSandbox, matchL4(unix.IPPROTO_UDP, gw.DNS), drop)
}

// removeRules deletes the instance's table if it exists.
func removeRules(inst string) error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	t := &nftables.Table{Family: nftables.TableFamilyINet, Name: tableName(inst)}
	c.DelTable(t)
	if err := c.Flush(); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("nftables: delete table %s: %w", t.Name, err)
	}
	return nil
}
