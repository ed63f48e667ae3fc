package api_test

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// metricLabelValues are the values each /metrics label may take: a fixed set, whatever
// clients send and however many sandboxes there are.
var metricLabelValues = map[string]func(string) bool{
	"method": func(v string) bool {
		return strings.Contains(" GET HEAD POST PUT PATCH DELETE OPTIONS CONNECT TRACE OTHER ", " "+v+" ")
	},
	"code": func(v string) bool {
		n, err := strconv.Atoi(v)
		return err == nil && (n == 0 || (n >= 100 && n <= 599))
	},
	"state": func(v string) bool {
		return strings.Contains(" creating running pausing paused resuming deleting deleted error ", " "+v+" ")
	},
	"decision": func(v string) bool { return v == "allow" || v == "deny" },
}

var metricLabelRE = regexp.MustCompile(`(\w+)="([^"]*)"`)

// metricSeries returns the series lines of /metrics and fails on a label outside its set.
func metricSeries(t *testing.T, e *env) []string {
	t.Helper()
	r := e.doKey("", "GET", "/metrics", "")
	if r.status != 200 {
		t.Fatalf("metrics: %d", r.status)
	}
	var series []string
	for _, line := range strings.Split(string(r.body), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		series = append(series, line)
		for _, m := range metricLabelRE.FindAllStringSubmatch(line, -1) {
			ok, known := metricLabelValues[m[1]]
			if !known {
				t.Errorf("label %q in %q: not one this test knows is bounded", m[1], line)
			} else if !ok(m[2]) {
				t.Errorf("label %s=%q in %q: not in its bounded set", m[1], m[2], line)
			}
		}
	}
	return series
}

func TestMetricsLabelsBounded(t *testing.T) {
	e := newEnv(t)
	var ids []string
	for range 5 {
		ids = append(ids, e.create(""))
	}
	// Made-up methods, with and without a key, on routes that exist and that do not.
	for i := range 200 {
		e.doKey("", fmt.Sprintf("X%dMETHOD", i), "/v1/sandboxes", "")
		e.do(fmt.Sprintf("BREW%d", i), "/v1/sandboxes/"+ids[i%len(ids)], "")
		e.do("GET", fmt.Sprintf("/v1/nothing/%d", i), "")
	}
	metricSeries(t, e) // so that GET /metrics 200 is among the series already
	before := metricSeries(t, e)
	for range 5 {
		ids = append(ids, e.create(""))
	}
	for i := range 100 {
		e.do(fmt.Sprintf("OTHER%d", i), "/v1/sandboxes/"+ids[i%len(ids)], "")
	}
	after := metricSeries(t, e)
	if len(after) != len(before) {
		t.Errorf("series grew from %d to %d with more sandboxes and methods:\n%s", len(before), len(after), strings.Join(after, "\n"))
	}
	if len(after) > 40 {
		t.Errorf("%d series: %s", len(after), strings.Join(after, "\n"))
	}
	body := strings.Join(after, "\n")
	for _, id := range ids {
		if strings.Contains(body, id) {
			t.Fatalf("/metrics names sandbox %s", id)
		}
	}
}
