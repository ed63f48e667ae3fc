package spacedtest

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha1"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// "The internet" of egress tests and benchmarks: a network namespace of our own with DNS, HTTP
// and HTTPS servers on addresses we assign (TEST-NET-3, 203.0.113.0/24), logging everything that
// reaches them; and a namespace for spaced whose only route out leads there. No packet leaves
// the machine.
const (
	InetGW      = "203.0.113.1"   // the internet's side of the link
	InetAllowed = "203.0.113.10"  // allowed.test
	InetDenied  = "203.0.113.20"  // denied.test
	InetDNS     = "203.0.113.53"  // the resolver spaced is pointed at
	SpacedAddr  = "203.0.113.254" // spaced's namespace
	MetadataIP  = "169.254.169.254"
)

// Internet is a running fake internet and the namespace spaced runs in.
type Internet struct {
	InetNS, HostNS string // namespace names (see NSPath)
	CAPEM          []byte // the CA of the internet's HTTPS servers

	mu      sync.Mutex
	seen    []string
	closers []io.Closer
}

// NSPath is the path of a named network namespace.
func NSPath(name string) string { return "/run/netns/" + name }

func ipcmd(args ...string) error {
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

// NewInternet builds the two namespaces and starts the internet's servers. Close removes it all.
func NewInternet() (*Internet, error) {
	suffix := RandomHex(3)
	in := &Internet{InetNS: "spx-i-" + suffix, HostNS: "spx-h-" + suffix}
	vi, vh := "spxi"+suffix, "spxh"+suffix
	steps := [][]string{
		{"netns", "add", in.InetNS}, {"netns", "add", in.HostNS},
		{"link", "add", vi, "netns", in.InetNS, "type", "veth", "peer", "name", vh, "netns", in.HostNS},
	}
	for _, a := range []string{InetGW + "/24", InetAllowed + "/32", InetDenied + "/32", InetDNS + "/32", MetadataIP + "/32"} {
		steps = append(steps, []string{"-n", in.InetNS, "addr", "add", a, "dev", vi})
	}
	steps = append(steps,
		[]string{"-n", in.HostNS, "addr", "add", SpacedAddr + "/24", "dev", vh},
		[]string{"-n", in.InetNS, "link", "set", "lo", "up"},
		[]string{"-n", in.HostNS, "link", "set", "lo", "up"},
		[]string{"-n", in.InetNS, "link", "set", vi, "up"},
		[]string{"-n", in.HostNS, "link", "set", vh, "up"},
		[]string{"-n", in.HostNS, "route", "add", "default", "via", InetGW},
	)
	for _, s := range steps {
		if err := ipcmd(s...); err != nil {
			in.Close()
			return nil, err
		}
	}
	if err := in.startServers(); err != nil {
		in.Close()
		return nil, err
	}
	return in, nil
}

// Close stops the servers and removes both namespaces (and with them the link).
func (in *Internet) Close() {
	for _, c := range in.closers {
		c.Close()
	}
	for _, ns := range []string{in.HostNS, in.InetNS} {
		exec.Command("ip", "netns", "del", ns).Run()
	}
}

func (in *Internet) record(format string, args ...any) {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.seen = append(in.seen, fmt.Sprintf(format, args...))
}

// Seen returns what reached the internet (and the host listeners) so far, a line each.
func (in *Internet) Seen() []string {
	in.mu.Lock()
	defer in.mu.Unlock()
	return append([]string(nil), in.seen...)
}

// Saw reports whether some line that reached the far side contains all of parts.
func (in *Internet) Saw(parts ...string) bool {
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

func (in *Internet) listen(ns, network, addr string) (net.Listener, error) {
	var ln net.Listener
	err := InNetns(NSPath(ns), func() (err error) {
		ln, err = net.Listen(network, addr)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("listen %s in %s: %w", addr, ns, err)
	}
	in.closers = append(in.closers, ln)
	return ln, nil
}

func (in *Internet) listenPacket(ns, network, addr string) (net.PacketConn, error) {
	var pc net.PacketConn
	err := InNetns(NSPath(ns), func() (err error) {
		pc, err = net.ListenPacket(network, addr)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("listen %s %s in %s: %w", network, addr, ns, err)
	}
	in.closers = append(in.closers, pc)
	return pc, nil
}

// certs makes a CA and a certificate for the internet's HTTPS names.
func (in *Internet) certs() (tls.Certificate, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	ca := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test internet CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		return tls.Certificate{}, err
	}
	caCert, _ := x509.ParseCertificate(caDER)
	in.CAPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	leaf := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "allowed.test"},
		DNSNames:  []string{"allowed.test", "denied.test", "meta.test", "rebind.test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, leaf, caCert, &key.PublicKey, caKey)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

func (in *Internet) startServers() error {
	zone := map[string]string{
		"allowed.test.": InetAllowed, "denied.test.": InetDenied,
		"rebind.test.": "10.1.2.3", "meta.test.": MetadataIP,
	}
	pc, err := in.listenPacket(in.InetNS, "udp4", InetDNS+":53")
	if err != nil {
		return err
	}
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

	cert, err := in.certs()
	if err != nil {
		return err
	}
	for _, ip := range []string{InetAllowed, InetDenied, MetadataIP} {
		handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			scheme := "http"
			if r.TLS != nil {
				scheme = "https sni=" + r.TLS.ServerName
			}
			body, _ := io.Copy(io.Discard, io.LimitReader(r.Body, 1<<20)) // a 100-continue waits for this read
			in.record("%s request at %s host=%s from %s path=%s auth=%s proto=%s body=%d", scheme, ip, r.Host, r.RemoteAddr, r.URL.Path, r.Header.Get("Authorization"), r.Proto, body)
			if strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
				websocketEcho(w, r)
				return
			}
			fmt.Fprintf(w, "internet:%s:%s\n", ip, r.Host)
		})
		plain, err := in.listen(in.InetNS, "tcp4", ip+":80")
		if err != nil {
			return err
		}
		go (&http.Server{Handler: handler}).Serve(plain)
		secure, err := in.listen(in.InetNS, "tcp4", ip+":443")
		if err != nil {
			return err
		}
		go (&http.Server{Handler: handler, TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}}}).ServeTLS(secure, "", "")
		// UDP (QUIC's port and another): anything arriving is logged.
		for _, port := range []string{"443", "9999"} {
			u, err := in.listenPacket(in.InetNS, "udp4", ip+":"+port)
			if err != nil {
				return err
			}
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
	icmp, err := in.listenPacket(in.InetNS, "ip4:icmp", "0.0.0.0")
	if err != nil {
		return err
	}
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := icmp.ReadFrom(buf)
			if err != nil {
				return
			}
			// Echo requests are what a sandbox could send; other types (an unreachable for a
			// late DNS answer, say) are logged apart so that they are not mistaken for one.
			if n > 0 && buf[0] == 8 {
				in.record("icmp echo from %s", from)
			} else if n > 0 {
				in.record("icmp type %d from %s", buf[0], from)
			}
		}
	}()
	return nil
}

// websocketEcho completes a WebSocket handshake (RFC 6455) and echoes raw bytes back until the
// client closes: enough to see an upgrade go through the egress gateway both ways.
func websocketEcho(w http.ResponseWriter, r *http.Request) {
	h := sha1.Sum([]byte(r.Header.Get("Sec-WebSocket-Key") + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"))
	hj, ok := w.(http.Hijacker)
	if !ok {
		http.Error(w, "no upgrade over this protocol", http.StatusBadRequest)
		return
	}
	c, rw, err := hj.Hijack()
	if err != nil {
		return
	}
	defer c.Close()
	fmt.Fprintf(rw, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n\r\n", base64.StdEncoding.EncodeToString(h[:]))
	rw.Flush()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 4096)
	for {
		n, err := rw.Read(buf)
		if n > 0 {
			c.Write(buf[:n])
		}
		if err != nil {
			return
		}
	}
}

// HostListener listens on addr in spaced's namespace and logs connections: the host's own
// ports, which no sandbox may reach.
func (in *Internet) HostListener(addr string) error {
	ln, err := in.listen(in.HostNS, "tcp4", addr)
	if err != nil {
		return err
	}
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
	return nil
}
