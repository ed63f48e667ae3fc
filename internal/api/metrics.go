package api

import (
	"fmt"
	"net/http"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// metrics are the counters /metrics exposes in Prometheus text format.
type metrics struct {
	mu       sync.Mutex
	requests map[string]uint64 // "method code"
	seconds  float64
	execs    atomic.Uint64
}

func newMetrics() *metrics { return &metrics{requests: map[string]uint64{}} }

// metricMethods are the methods /metrics names; any other (a client may send any token) is
// counted as OTHER, so that label values stay bounded whoever calls.
var metricMethods = map[string]bool{
	http.MethodGet: true, http.MethodHead: true, http.MethodPost: true, http.MethodPut: true,
	http.MethodPatch: true, http.MethodDelete: true, http.MethodOptions: true,
	http.MethodConnect: true, http.MethodTrace: true,
}

// metricLabels bounds the labels of one request: a known method or OTHER, and a status that
// is a valid HTTP status (a sandbox's server, reached through a port route, picks its own) or 0.
func metricLabels(method string, status int) (string, int) {
	if !metricMethods[method] {
		method = "OTHER"
	}
	if status < 100 || status > 599 {
		status = 0
	}
	return method, status
}

func (m *metrics) observe(method string, status int, d time.Duration) {
	method, status = metricLabels(method, status)
	m.mu.Lock()
	m.requests[fmt.Sprintf("%s %d", method, status)]++
	m.seconds += d.Seconds()
	m.mu.Unlock()
}

func (s *Server) handleMetrics(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; version=0.0.4")
	counts := s.sb.Counts()
	fmt.Fprintln(w, "# HELP space_sandboxes Sandboxes by state.")
	fmt.Fprintln(w, "# TYPE space_sandboxes gauge")
	states := make([]string, 0, len(counts))
	for st := range counts {
		states = append(states, st)
	}
	sort.Strings(states)
	for _, st := range states {
		fmt.Fprintf(w, "space_sandboxes{state=%q} %d\n", st, counts[st])
	}
	fmt.Fprintln(w, "# HELP space_warm_pool_ready Sandboxes of the default shape started ahead of demand.")
	fmt.Fprintln(w, "# TYPE space_warm_pool_ready gauge")
	fmt.Fprintf(w, "space_warm_pool_ready %d\n", s.sb.WarmReady())
	fmt.Fprintln(w, "# HELP space_execs_total Commands started through the API.")
	fmt.Fprintln(w, "# TYPE space_execs_total counter")
	fmt.Fprintf(w, "space_execs_total %d\n", s.metrics.execs.Load())
	fmt.Fprintln(w, "# HELP space_exec_spool_bytes Output of running commands held on disk for their JSON answers.")
	fmt.Fprintln(w, "# TYPE space_exec_spool_bytes gauge")
	fmt.Fprintf(w, "space_exec_spool_bytes %d\n", s.spool.used.Load())
	fmt.Fprintln(w, "# HELP space_exec_spool_limit_bytes What all spooled output may hold at once.")
	fmt.Fprintln(w, "# TYPE space_exec_spool_limit_bytes gauge")
	fmt.Fprintf(w, "space_exec_spool_limit_bytes %d\n", s.spool.limit)
	egress := s.sb.EgressCounts()
	fmt.Fprintln(w, "# HELP space_egress_decisions_total Egress gateway decisions (connections and DNS queries) by decision.")
	fmt.Fprintln(w, "# TYPE space_egress_decisions_total counter")
	for _, d := range []string{"allow", "deny"} {
		fmt.Fprintf(w, "space_egress_decisions_total{decision=%q} %d\n", d, egress[d])
	}
	s.metrics.mu.Lock()
	keys := make([]string, 0, len(s.metrics.requests))
	for k := range s.metrics.requests {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	fmt.Fprintln(w, "# HELP space_http_requests_total HTTP requests by method and status.")
	fmt.Fprintln(w, "# TYPE space_http_requests_total counter")
	for _, k := range keys {
		var method string
		var code int
		fmt.Sscanf(k, "%s %d", &method, &code)
		fmt.Fprintf(w, "space_http_requests_total{method=%q,code=\"%d\"} %d\n", method, code, s.metrics.requests[k])
	}
	fmt.Fprintln(w, "# HELP space_http_request_seconds_total Time spent serving HTTP requests.")
	fmt.Fprintln(w, "# TYPE space_http_request_seconds_total counter")
	fmt.Fprintf(w, "space_http_request_seconds_total %g\n", s.metrics.seconds)
	s.metrics.mu.Unlock()
}
