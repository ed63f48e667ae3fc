package egress

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"net/http"
	"net/netip"
	"strings"
)

// What a connection's first bytes say about where it is going.
type sniffed struct {
	kind string // "tls", "http" or "" (neither)
	name string // SNI or Host, normalized; "" if none
	// ech: the ClientHello carries an encrypted_client_hello extension. A real one and GREASE
	// (random config, what Chromium sends) look alike on purpose; the gateway publishes no ECH
	// config, so neither names a config it knows, and it handshakes with the outer ClientHello.
	ech  bool
	need bool // more bytes are needed to tell
}

const maxSniff = 16 << 10

var errShort = errors.New("need more bytes")

// sniff looks at the first bytes of a connection.
func sniff(b []byte) sniffed {
	if len(b) == 0 {
		return sniffed{need: true}
	}
	if b[0] == 0x16 { // TLS handshake record
		name, ech, err := parseClientHello(b)
		if errors.Is(err, errShort) {
			return sniffed{kind: "tls", need: len(b) < maxSniff}
		}
		if err != nil {
			return sniffed{kind: "tls"}
		}
		return sniffed{kind: "tls", name: hostName(name), ech: ech}
	}
	if looksHTTP(b) {
		end := bytes.Index(b, []byte("\r\n\r\n"))
		if end < 0 {
			return sniffed{kind: "http", need: len(b) < maxSniff}
		}
		req, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(b[:end+4])))
		if err != nil {
			return sniffed{kind: "http"}
		}
		return sniffed{kind: "http", name: hostName(splitHost(req.Host))}
	}
	return sniffed{}
}

// splitHost drops the port of a Host header value ("[::1]:80", "a.test:8080", "a.test").
func splitHost(h string) string {
	if i := strings.LastIndexByte(h, ':'); i >= 0 && !strings.Contains(h[i:], "]") {
		h = h[:i]
	}
	return h
}

// hostName normalizes a name from SNI or Host; an address literal names no host (the
// connection is then judged by its destination address).
func hostName(s string) string {
	if _, err := netip.ParseAddr(strings.TrimSuffix(strings.Trim(s, "[]"), ".")); err == nil {
		return "" // "203.0.113.20." is an address too, not a name to resolve
	}
	return NormalizeName(s)
}

func looksHTTP(b []byte) bool {
	for _, m := range []string{"GET ", "POST ", "PUT ", "HEAD ", "DELETE ", "OPTIONS ", "PATCH ", "CONNECT ", "TRACE "} {
		n := min(len(b), len(m))
		if string(b[:n]) == m[:n] {
			return true
		}
	}
	return false
}

// parseClientHello reads the TLS records at the start of b (a ClientHello may span several)
// and returns the server_name it carries and whether it offers ECH. errShort means b ends
// before the ClientHello does.
func parseClientHello(b []byte) (string, bool, error) {
	// Reassemble the handshake message from records.
	var hs []byte
	for {
		if len(b) < 5 {
			return "", false, errShort
		}
		if b[0] != 0x16 {
			return "", false, errors.New("not a handshake record")
		}
		n := int(binary.BigEndian.Uint16(b[3:5]))
		if n == 0 || n > 1<<14+2048 {
			return "", false, errors.New("bad record length")
		}
		if len(b) < 5+n {
			return "", false, errShort
		}
		hs = append(hs, b[5:5+n]...)
		b = b[5+n:]
		if len(hs) >= 4 {
			if hs[0] != 1 {
				return "", false, errors.New("not a ClientHello")
			}
			need := 4 + (int(hs[1])<<16 | int(hs[2])<<8 | int(hs[3]))
			if need > maxSniff {
				return "", false, errors.New("ClientHello too large")
			}
			if len(hs) >= need {
				hs = hs[4:need]
				break
			}
		}
	}
	r := reader(hs)
	if !r.skip(2 + 32) { // version, random
		return "", false, errors.New("short ClientHello")
	}
	for _, lenBytes := range []int{1, 2, 1} { // session id, cipher suites, compression methods
		if _, ok := r.vec(lenBytes); !ok {
			return "", false, errors.New("short ClientHello")
		}
	}
	if len(r) == 0 {
		return "", false, nil // no extensions
	}
	exts, ok := r.vec(2)
	if !ok {
		return "", false, errors.New("bad extensions")
	}
	var name string
	var ech bool
	for len(exts) > 0 {
		typ, ok1 := exts.u16()
		body, ok2 := exts.vec(2)
		if !ok1 || !ok2 {
			return "", false, errors.New("bad extension")
		}
		switch typ {
		case 0: // server_name
			list, ok := body.vec(2)
			if !ok {
				return "", false, errors.New("bad server_name")
			}
			for len(list) > 0 {
				nt := list[0]
				list = list[1:]
				v, ok := list.vec(2)
				if !ok {
					return "", false, errors.New("bad server_name")
				}
				if nt == 0 && name == "" {
					name = string(v)
				}
			}
		case 0xfe0d: // encrypted_client_hello
			ech = true
		}
	}
	return name, ech, nil
}

// reader is a byte slice read front to back.
type reader []byte

func (r *reader) skip(n int) bool {
	if len(*r) < n {
		return false
	}
	*r = (*r)[n:]
	return true
}

func (r *reader) u16() (uint16, bool) {
	if len(*r) < 2 {
		return 0, false
	}
	v := binary.BigEndian.Uint16(*r)
	*r = (*r)[2:]
	return v, true
}

// vec reads a vector with a lenBytes-byte length prefix.
func (r *reader) vec(lenBytes int) (reader, bool) {
	if len(*r) < lenBytes {
		return nil, false
	}
	n := 0
	for _, c := range (*r)[:lenBytes] {
		n = n<<8 | int(c)
	}
	*r = (*r)[lenBytes:]
	if len(*r) < n {
		return nil, false
	}
	v := (*r)[:n]
	*r = (*r)[n:]
	return v, true
}
