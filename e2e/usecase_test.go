package e2e

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"io"
	"math"
	"os"
	"strings"
	"testing"

	"github.com/space-sandbox/space/pkg/client"
)

// sharedTemplates is where built-in templates are cached across test runs on one machine, so
// the base template (minutes to build) is built once; internal/template's base test fills it.
// SPACE_TEMPLATES_DIR names another: a tree whose base recipe differs from the machine's other
// trees would otherwise evict their cached base, and they would rebuild it in turn.
func sharedTemplates() string {
	if d := os.Getenv("SPACE_TEMPLATES_DIR"); d != "" {
		return d
	}
	return "/var/cache/space-test/templates"
}

const messyCSV = `group,amount,date
  alpha ,"$1,234.50",2024-01-01
ALPHA,$100.00,2024-01-02
Beta,$200.25,2024-01-03
beta ,"$1,000.00",2024-01-04
Beta,$200.25,2024-01-03
gamma,not a number,2024-01-05
Gamma,$50.00,2024-01-06
`

const cleanScript = `
import json, sys
import pandas as pd
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

df = pd.read_csv("/work/sales.csv")
df["group"] = df["group"].str.strip().str.lower()
df["amount"] = pd.to_numeric(df["amount"].str.replace(r"[$,]", "", regex=True), errors="coerce")
df = df.dropna(subset=["amount"]).drop_duplicates()
totals = df.groupby("group")["amount"].sum().round(2)
fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
totals.plot.bar(ax=ax)
ax.set_ylabel("total")
fig.savefig("/work/totals.png")
json.dump({"rows": len(df), "totals": totals.to_dict()}, sys.stdout)
`

// TestDataAnalysis is SPACE's first use case on the base template: a messy spreadsheet in,
// cleaned with pandas, totals computed, a matplotlib chart out.
func TestDataAnalysis(t *testing.T) {
	d := startSpaced(t)
	c := d.Client
	ctx := ctxT(t)
	sb, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{}) // base is the default
	if err != nil {
		t.Fatalf("create from base: %v", err)
	}
	if _, err := c.Upload(ctx, sb.ID, "/work/sales.csv", strings.NewReader(messyCSV), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Upload(ctx, sb.ID, "/work/clean.py", strings.NewReader(cleanScript), nil); err != nil {
		t.Fatal(err)
	}
	res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Cmd: []string{"python3", "/work/clean.py"}, Env: map[string]string{"MPLCONFIGDIR": "/tmp/mpl"}})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("script: %+v %v", res, err)
	}
	var out struct {
		Rows   int                `json:"rows"`
		Totals map[string]float64 `json:"totals"`
	}
	if err := json.Unmarshal([]byte(res.Stdout), &out); err != nil {
		t.Fatalf("script output %q: %v", res.Stdout, err)
	}
	want := map[string]float64{"alpha": 1334.50, "beta": 1200.25, "gamma": 50.00}
	if out.Rows != 5 || len(out.Totals) != 3 {
		t.Fatalf("cleaned %d rows into %v; want 5 rows, 3 groups", out.Rows, out.Totals)
	}
	for g, v := range want {
		if math.Abs(out.Totals[g]-v) > 0.001 {
			t.Errorf("total of %s = %v, want %v", g, out.Totals[g], v)
		}
	}
	rc, err := c.Download(ctx, sb.ID, "/work/totals.png")
	if err != nil {
		t.Fatal(err)
	}
	png, err := io.ReadAll(rc)
	rc.Close()
	if err != nil {
		t.Fatal(err)
	}
	// A PNG: the signature, then the IHDR chunk with width and height.
	if len(png) < 24 || !bytes.Equal(png[:8], []byte("\x89PNG\r\n\x1a\n")) || string(png[12:16]) != "IHDR" {
		t.Fatalf("not a PNG (%d bytes)", len(png))
	}
	if w, h := binary.BigEndian.Uint32(png[16:20]), binary.BigEndian.Uint32(png[20:24]); w != 600 || h != 400 {
		t.Fatalf("chart is %dx%d, want 600x400", w, h)
	}
	if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
}
