package egress

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"time"
)

// Credential is a header the gateway sets on intercepted requests to Hosts (rules as in
// policies), replacing whatever the sandbox sent.
type Credential struct {
	Name   string
	Hosts  []Rule
	Header string
	Value  string
}

// credentialsFor returns the credentials that apply to host.
func (t Target) credentialsFor(host string, port uint16) []Credential {
	var out []Credential
	for _, c := range t.Credentials {
		for _, r := range c.Hosts {
			if r.matches(host, netip.Addr{}, port) {
				out = append(out, c)
				break
			}
		}
	}
	return out
}

// prefixConn replays bytes already read from a connection before reading on.
type prefixConn struct {
	net.Conn
	r io.Reader
}

func (p *prefixConn) Read(b []byte) (int, error) { return p.r.Read(b) }

// intercept terminates the sandbox's TLS with a certificate for name from the installation CA,
// opens a verified TLS connection to the real host, and relays HTTP/1.1 requests one by one:
// each must name the same host as the SNI (domain fronting is refused in both directions: a
// different Host behind an allowed SNI here, an allowed Host behind a denied SNI before), and
// the credentials for the host are set, replacing the sandbox's own values.
func (g *Gateway) intercept(ctx context.Context, c net.Conn, first []byte, name string, ips []netip.Addr, port uint16, tgt Target, ev Event) {
	deny := func(reason string) {
		ev.Decision, ev.Reason, ev.Time = "deny", reason, time.Now().UTC()
		g.cfg.Audit.Record(ev)
	}
	// The real host first: its certificate must be valid for name before anything is sent.
	var up *tls.Conn
	var err error
	dialer := &net.Dialer{Timeout: 10 * time.Second}
	for _, ip := range ips {
		ev.IP = ip.String()
		up, err = tls.DialWithDialer(dialer, "tcp4", netip.AddrPortFrom(ip, port).String(), &tls.Config{
			ServerName: name, RootCAs: g.roots, NextProtos: []string{"http/1.1"}, MinVersion: tls.VersionTLS12,
		})
		if err == nil {
			break
		}
	}
	if err != nil {
		deny("upstream TLS for " + name + " failed: " + err.Error())
		return
	}
	defer up.Close()
	cs := tls.Server(&prefixConn{Conn: c, r: io.MultiReader(bytes.NewReader(first), c)}, &tls.Config{
		NextProtos: []string{"http/1.1"}, MinVersion: tls.VersionTLS12,
		GetCertificate: func(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
			if hostName(hello.ServerName) != name {
				return nil, fmt.Errorf("SNI %q changed", hello.ServerName)
			}
			return g.cfg.CA.leaf(name)
		},
	})
	cs.SetDeadline(time.Now().Add(15 * time.Second))
	if err := cs.HandshakeContext(ctx); err != nil {
		deny("TLS with the sandbox failed: " + err.Error())
		return
	}
	cs.SetDeadline(time.Time{})
	ev.Decision, ev.Reason, ev.Time = "allow", "inspected: "+ev.Reason, time.Now().UTC()
	g.cfg.Audit.Record(ev)
	creds := tgt.credentialsFor(name, port)
	cr, ur := bufio.NewReader(cs), bufio.NewReader(up)
	for {
		req, err := http.ReadRequest(cr)
		if err != nil {
			return
		}
		host := req.Host
		if h, _, err := net.SplitHostPort(host); err == nil {
			host = h
		}
		if hostName(host) != name {
			deny(fmt.Sprintf("Host %q does not match the TLS server name %q (domain fronting)", req.Host, name))
			body := "refused by the egress gateway: Host does not match the TLS server name\n"
			fmt.Fprintf(cs, "HTTP/1.1 421 Misdirected Request\r\nContent-Type: text/plain\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(body), body)
			return
		}
		for _, cr := range creds {
			req.Header.Set(cr.Header, cr.Value)
		}
		if err := req.Write(up); err != nil {
			return
		}
		resp, err := http.ReadResponse(ur, req)
		if err != nil {
			return
		}
		err = resp.Write(cs)
		resp.Body.Close()
		if err != nil || req.Close || resp.Close {
			return
		}
	}
}

// rootPool is the system roots plus extra PEM certificates (SPACE_EGRESS_CA).
func rootPool(extra []byte) (*x509.CertPool, error) {
	pool, err := x509.SystemCertPool()
	if err != nil || pool == nil {
		pool = x509.NewCertPool()
	}
	if len(bytes.TrimSpace(extra)) > 0 && !pool.AppendCertsFromPEM(extra) {
		return nil, fmt.Errorf("no certificate in the extra roots")
	}
	return pool, nil
}

// inspect reports whether a TLS connection to name is intercepted: when the policy asks for
// it, or when a credential applies to the host.
func (t Target) inspect(name string, port uint16) bool {
	return t.Inspect || len(t.credentialsFor(name, port)) > 0
}
