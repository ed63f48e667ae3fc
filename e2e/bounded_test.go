package e2e

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/spacedtest"
	"github.com/space-sandbox/space/pkg/client"
)

// spacedUse is spaced's resident memory (KiB, VmRSS) and open descriptors right now.
func spacedUse(t *testing.T, pid int) (rssKiB, fds int) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for l := range strings.Lines(string(b)) {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			rssKiB, _ = strconv.Atoi(f[1])
		}
	}
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	return rssKiB, len(ents)
}

// settle waits up to 20 s for spaced's descriptors to fall to at most want, and returns the
// last reading.
func settle(t *testing.T, pid, want int) (rssKiB, fds int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		rssKiB, fds = spacedUse(t, pid)
		if fds <= want || time.Now().After(deadline) {
			return rssKiB, fds
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// dialSpaced opens a raw TCP connection to spaced (loopback).
func dialSpaced(t *testing.T, d *spacedtest.Daemon) net.Conn {
	t.Helper()
	conn, err := net.DialTimeout("tcp", strings.TrimPrefix(d.URL, "http://"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return conn
}

// TestSpacedStaysBounded: clients that open streams and never read them, and clients that send
// requests slowly, leave spaced's memory and descriptors bounded, and all is given back when
// they go; a flood of output through a JSON exec is spooled under SPACE_HOME, bounded.
func TestSpacedStaysBounded(t *testing.T) {
	d := startSpaced(t, "SPACE_WARM_POOL=0", "SPACE_EXEC_SPOOL_MIB=64")
	c := d.Client
	pid := d.PID()
	id := create(t, c, client.CreateSandboxRequest{Template: "minimal"}).ID
	// A chatty background process: 4 KiB lines, 20 a second, that nobody reads.
	chatty, err := c.ExecBackground(ctxT(t), id, client.ExecRequest{Command: "while :; do head -c 4096 /dev/zero | tr '\\000' z; echo; sleep 0.05; done"})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	rss0, fds0 := spacedUse(t, pid)
	t.Logf("baseline: RSS %d MiB, %d descriptors", rss0>>10, fds0)
	// What spaced may keep after a burst: its database pool grows to 16 connections of two
	// descriptors each (the file and its WAL) and keeps them.
	const keep = 32

	t.Run("abandoned-sse", func(t *testing.T) {
		// 500 SSE streams, half of the chatty process's output and half of the event feed; none
		// is read. Then the clients vanish without a word.
		const n = 500
		var conns []net.Conn
		defer func() {
			for _, conn := range conns {
				conn.Close()
			}
		}()
		for i := range n {
			path := "/v1/events"
			if i%2 == 0 {
				path = fmt.Sprintf("/v1/sandboxes/%s/processes/%d/events", id, chatty)
			}
			conn := dialSpaced(t, d)
			conns = append(conns, conn)
			fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: spaced\r\nAuthorization: Bearer %s\r\nAccept: text/event-stream\r\n\r\n", path, d.Opts.Key)
		}
		// Check that the streams are real: one of each answers 200 with events.
		for _, conn := range conns[:2] {
			conn.SetReadDeadline(time.Now().Add(10 * time.Second))
			line, err := bufio.NewReader(conn).ReadString('\n')
			if err != nil || !strings.Contains(line, "200") {
				t.Fatalf("stream answered %q, %v", line, err)
			}
		}
		time.Sleep(10 * time.Second) // output keeps coming; nobody reads
		rss, fds := spacedUse(t, pid)
		t.Logf("with %d unread streams: RSS %d MiB (+%d), %d descriptors", n, rss>>10, (rss-rss0)>>10, fds)
		// Each stream may cost spaced a connection and a socket to the agent, and buffers; not
		// the output that keeps coming.
		if rss-rss0 > 256<<10 {
			t.Errorf("spaced's RSS grew by %d MiB with %d unread streams", (rss-rss0)>>10, n)
		}
		for _, conn := range conns {
			conn.Close()
		}
		conns = nil
		rss, fds = settle(t, pid, fds0+keep)
		t.Logf("after the clients left: RSS %d MiB, %d descriptors", rss>>10, fds)
		if fds > fds0+keep {
			t.Errorf("spaced holds %d descriptors after the streams closed, %d before:\n%s", fds, fds0, fdList(pid))
		}
	})

	t.Run("slowloris", func(t *testing.T) {
		// 200 clients that send headers a byte at a time and never finish, and 50 that send a
		// JSON body a byte at a time. Spaced hangs up on all of them (header timeout 10 s, body
		// 30 s) and gives back what they held.
		var conns []net.Conn
		defer func() {
			for _, conn := range conns {
				conn.Close()
			}
		}()
		for i := range 250 {
			conn := dialSpaced(t, d)
			conns = append(conns, conn)
			if i < 200 {
				io.WriteString(conn, "GET /v1/info HTTP/1.1\r\nHost: spaced\r\nX-Slow: ")
			} else {
				fmt.Fprintf(conn, "POST /v1/sandboxes HTTP/1.1\r\nHost: spaced\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{", d.Opts.Key)
			}
		}
		start := time.Now()
		closed := make([]bool, len(conns))
		left := len(conns)
		for time.Since(start) < 45*time.Second && left > 0 {
			for i, conn := range conns {
				if closed[i] {
					continue
				}
				conn.SetWriteDeadline(time.Now().Add(time.Second))
				b := "a"
				if i >= 200 {
					b = " "
				}
				if _, err := io.WriteString(conn, b); err != nil {
					closed[i] = true
					left--
					continue
				}
				conn.SetReadDeadline(time.Now().Add(time.Millisecond))
				var buf [512]byte
				if n, err := conn.Read(buf[:]); n > 0 || (err != nil && !os.IsTimeout(err)) {
					closed[i] = true // answered (an error) or hung up
					left--
				}
			}
			time.Sleep(time.Second)
		}
		t.Logf("%d of %d slow clients still connected after %s", left, len(conns), time.Since(start).Round(time.Second))
		if left > 0 {
			t.Errorf("spaced still serves %d slow clients after %s", left, time.Since(start).Round(time.Second))
		}
		for _, conn := range conns {
			conn.Close()
		}
		conns = nil
		rss, fds := settle(t, pid, fds0+keep)
		t.Logf("after: RSS %d MiB, %d descriptors", rss>>10, fds)
		if fds > fds0+keep {
			t.Errorf("spaced holds %d descriptors after the slow clients, %d before", fds, fds0)
		}
		if got, err := c.ListSandboxes(ctxT(t), client.ListSandboxesOptions{}); err != nil || len(got) != 1 {
			t.Errorf("a slow create changed state: %d sandboxes, %v", len(got), err)
		}
	})

	t.Run("output-flood", func(t *testing.T) {
		// 300 MB of output through a JSON exec: the answer carries the per-stream share and says
		// truncated; the spool is under SPACE_HOME and bounded by SPACE_EXEC_SPOOL_MIB.
		spool := filepath.Join(d.Opts.Home, "spool")
		rss0, _ := spacedUse(t, pid)
		done := make(chan *client.ExecResult, 1)
		go func() {
			res, err := c.Exec(ctxT(t), id, client.ExecRequest{Command: "head -c 300000000 /dev/zero | tr '\\000' y"})
			if err != nil {
				t.Errorf("flood: %v", err)
			}
			done <- res
		}()
		var res *client.ExecResult
		most := 0
		for res == nil {
			select {
			case res = <-done:
			case <-time.After(100 * time.Millisecond):
				if rss, _ := spacedUse(t, pid); rss > most {
					most = rss
				}
				for _, f := range spoolFiles(t, pid) {
					if !strings.HasPrefix(f, spool+"/") {
						t.Errorf("spaced spools output at %s, outside %s", f, spool)
					}
				}
			}
		}
		t.Logf("flood: %d bytes answered, truncated %v; spaced RSS at most %d MiB (+%d)", len(res.Stdout), res.Truncated, most>>10, (most-rss0)>>10)
		if res.Stdout == "" || len(res.Stdout) > 256<<20 || !res.Truncated {
			t.Errorf("flood answered %d bytes, truncated %v; want at most 256 MiB and truncated", len(res.Stdout), res.Truncated)
		}
		// The client decodes the answer in this process; spaced streams it from its spool.
		if most-rss0 > 128<<10 {
			t.Errorf("spaced's RSS grew by %d MiB during the flood", (most-rss0)>>10)
		}
		if ents, _ := os.ReadDir(spool); len(ents) > 0 {
			t.Errorf("spool holds %d names after the command", len(ents))
		}
	})
}

// spoolFiles lists the regular files spaced holds open (spool files are unlinked, so their
// link reads "<path> (deleted)"); the path is returned without the suffix.
func spoolFiles(t *testing.T, pid int) []string {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, _ := os.ReadDir(dir)
	var out []string
	for _, e := range ents {
		l, err := os.Readlink(filepath.Join(dir, e.Name()))
		if err != nil || !strings.Contains(l, "exec-") {
			continue
		}
		out = append(out, strings.TrimSuffix(l, " (deleted)"))
	}
	return out
}

// fdList describes spaced's open descriptors, for failure messages.
func fdList(pid int) string {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, _ := os.ReadDir(dir)
	var out []string
	for _, e := range ents {
		l, _ := os.Readlink(filepath.Join(dir, e.Name()))
		out = append(out, e.Name()+" "+l)
	}
	tcp, _ := os.ReadFile(fmt.Sprintf("/proc/%d/net/tcp", pid))
	return strings.Join(out, "\n") + "\n" + string(tcp)
}
