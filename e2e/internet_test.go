package e2e

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/space-sandbox/space/internal/spacedtest"
	"github.com/space-sandbox/space/pkg/client"
)

// "The internet" of the egress tests: a network namespace of our own with DNS, HTTP and HTTPS
// servers on addresses we assign (TEST-NET-3, 203.0.113.0/24), logging everything that reaches
// them; and a namespace for spaced whose only route out leads there. No packet leaves the
// machine.
const (
	inetGW      = "203.0.113.1"   // the internet's side of the link
	inetAllowed = "203.0.113.10"  // allowed.test
	inetDenied  = "203.0.113.20"  // denied.test
	inetDNS     = "203.0.113.53"  // the resolver spaced is pointed at
	spacedAddr  = "203.0.113.254" // spaced's namespace
	metadataIP  = "169.254.169.254"
)

type internet struct {
	t              *testing.T
	inetNS, hostNS string // names
	caPEM          []byte
	mu             sync.Mutex
	seen           []string // what reached the internet, one line each
	closers        []io.Closer
}

func nsPath(name string) string { return "/run/netns/" + name }

func ipcmd(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// newInternet builds the two namespaces and starts the internet's servers.
func newInternet(t *testing.T) *internet {
	suffix := spacedtest.RandomHex(3)
	in := &internet{t: t, inetNS: "spx-i-" + suffix, hostNS: "spx-h-" + suffix}
	ipcmd(t, "netns", "add", in.inetNS)
	ipcmd(t, "netns", "add", in.hostNS)
	t.Cleanup(in.close)
	vi, vh := "spxi"+suffix, "spxh"+suffix
	ipcmd(t, "link", "add", vi, "netns", in.inetNS, "type", "veth", "peer", "name", vh, "netns", in.hostNS)
	for _, a := range []string{inetGW + "/24", inetAllowed + "/32", inetDenied + "/32", inetDNS + "/32", metadataIP + "/32"} {
		ipcmd(t, "-n", in.inetNS, "addr", "add", a, "dev", vi)
	}
	ipcmd(t, "-n", in.hostNS, "addr", "add", spacedAddr+"/24", "dev", vh)
	for _, ns := range []string{in.inetNS, in.hostNS} {
		ipcmd(t, "-n", ns, "link", "set", "lo", "up")
	}
	ipcmd(t, "-n", in.inetNS, "link", "set", vi, "up")
	ipcmd(t, "-n", in.hostNS, "link", "set", vh, "up")
	ipcmd(t, "-n", in.hostNS, "route", "add", "default", "via", inetGW)
	in.startServers()
	return in
}

func (in *internet) close() {
	for _, c := range in.closers {
		c.Close()
	}
	for _, ns := range []string{in.hostNS, in.inetNS} {
		exec.Command("ip", "netns", "del", ns).Run()
	}
}

func (in *internet) record(format string, args ...any) {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.seen = append(in.seen, fmt.Sprintf(format, args...))
}

// Seen returns what reached the internet so far.
func (in *internet) Seen() []string {
	in.mu.Lock()
	defer in.mu.Unlock()
	return append([]string(nil), in.seen...)
}

// saw reports whether some line that reached the internet contains all of parts.
func (in *internet) saw(parts ...string) bool {
	for _, l := range in.Seen() {
		ok := true
		for _, p := range parts {
			ok = ok && strings.Contains(l, p)
		}
		if ok {
			return true
		}
	}
	return false
}

// listen opens a listener inside namespace ns.
func (in *internet) listen(ns, network, addr string) net.Listener {
	var ln net.Listener
	err := spacedtest.InNetns(nsPath(ns), func() (err error) {
		ln, err = net.Listen(network, addr)
		return err
	})
	if err != nil {
		in.t.Fatalf("listen %s in %s: %v", addr, ns, err)
	}
	in.closers = append(in.closers, ln)
	return ln
}

func (in *internet) listenPacket(ns, network, addr string) net.PacketConn {
	var pc net.PacketConn
	err := spacedtest.InNetns(nsPath(ns), func() (err error) {
		pc, err = net.ListenPacket(network, addr)
		return err
	})
	if err != nil {
		in.t.Fatalf("listen %s %s in %s: %v", network, addr, ns, err)
	}
	in.closers = append(in.closers, pc)
	return pc
}

// certs makes a CA and a certificate for the internet's HTTPS names.
func (in *internet) certs() tls.Certificate {
	t := in.t
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ca := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test internet CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	in.caPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	leaf := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "allowed.test"},
		DNSNames:  []string{"allowed.test", "denied.test", "meta.test", "rebind.test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, leaf, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func (in *internet) startServers() {
	zone := map[string]string{
		"allowed.test.": inetAllowed, "denied.test.": inetDenied,
		"rebind.test.": "10.1.2.3", "meta.test.": metadataIP,
	}
	pc := in.listenPacket(in.inetNS, "udp4", inetDNS+":53")
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		for _, q := range r.Question {
			in.record("dns query %s from %s", strings.ToLower(q.Name), w.RemoteAddr())
			if ip, ok := zone[strings.ToLower(q.Name)]; ok && q.Qtype == dns.TypeA {
				m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60}, A: net.ParseIP(ip)})
			} else if !ok {
				m.Rcode = dns.RcodeNameError
			}
		}
		w.WriteMsg(m)
	})}
	go srv.ActivateAndServe()

	cert := in.certs()
	for _, ip := range []string{inetAllowed, inetDenied, metadataIP} {
		handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			tlsInfo := "http"
			if r.TLS != nil {
				tlsInfo = "https sni=" + r.TLS.ServerName
			}
			in.record("%s request at %s host=%s from %s path=%s auth=%s", tlsInfo, ip, r.Host, r.RemoteAddr, r.URL.Path, r.Header.Get("Authorization"))
			fmt.Fprintf(w, "internet:%s:%s\n", ip, r.Host)
		})
		plain := in.listen(in.inetNS, "tcp4", ip+":80")
		go (&http.Server{Handler: handler}).Serve(plain)
		secure := in.listen(in.inetNS, "tcp4", ip+":443")
		go (&http.Server{Handler: handler, TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}}}).ServeTLS(secure, "", "")
		// UDP (QUIC's port and another) and raw ICMP: anything arriving is logged.
		for _, port := range []string{"443", "9999"} {
			u := in.listenPacket(in.inetNS, "udp4", ip+":"+port)
			go func() {
				buf := make([]byte, 2048)
				for {
					_, from, err := u.ReadFrom(buf)
					if err != nil {
						return
					}
					in.record("udp at %s:%s from %s", ip, port, from)
				}
			}()
		}
	}
	icmp := in.listenPacket(in.inetNS, "ip4:icmp", "0.0.0.0")
	go func() {
		buf := make([]byte, 2048)
		for {
			_, from, err := icmp.ReadFrom(buf)
			if err != nil {
				return
			}
			in.record("icmp from %s", from)
		}
	}()
}

// hostListener listens on addr in spaced's namespace and logs connections: the host's own
// ports, which no sandbox may reach.
func (in *internet) hostListener(addr string) {
	ln := in.listen(in.hostNS, "tcp4", addr)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			in.record("host port %s connected from %s", addr, c.RemoteAddr())
			r := bufio.NewReader(c)
			c.SetReadDeadline(time.Now().Add(time.Second))
			r.ReadString('\n')
			c.Close()
		}
	}()
}

// startSpacedIn starts spaced in the internet test's namespace for spaced, pointed at the
// internet's resolver, and checks at the end that it left nothing behind there.
func startSpacedIn(t *testing.T, in *internet, env ...string) *spacedtest.Daemon {
	t.Helper()
	bin := binDir(t)
	home := t.TempDir()
	// The gateway verifies the internet's servers against the internet's CA.
	caFile := filepath.Join(t.TempDir(), "internet-ca.pem")
	if err := os.WriteFile(caFile, in.caPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	env = append([]string{"SPACE_TEMPLATES_DIR=" + sharedTemplates, "SPACE_EGRESS_DNS=" + inetDNS + ":53",
		"SPACE_EGRESS_CA=" + caFile, "SPACE_WARM_POOL=0"}, env...)
	d, err := spacedtest.Start(context.Background(), spacedtest.Options{Bin: bin, Home: home, Env: env, Netns: nsPath(in.hostNS)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		if list, err := d.Client.ListSandboxes(ctx, client.ListSandboxesOptions{}); err == nil {
			for _, sb := range list {
				if err := d.Client.DeleteSandbox(ctx, sb.ID); err != nil {
					t.Errorf("cleanup: delete %s: %v", sb.ID, err)
				}
			}
		}
		if err := d.Stop(); err != nil {
			t.Errorf("stop spaced: %v", err)
		}
		var leaks []string
		spacedtest.InNetns(nsPath(in.hostNS), func() error {
			leaks = spacedtest.Leaks(d.Opts.Instance, home)
			return nil
		})
		if len(leaks) > 0 {
			t.Errorf("instance %s left behind:\n  %s", d.Opts.Instance, strings.Join(leaks, "\n  "))
		}
		if t.Failed() {
			t.Logf("spaced log:\n%s", tail(d.Log(), 80))
		}
	})
	return d
}
