package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/space-sandbox/space/pkg/client"
)

func (a *app) cmdCreate(args []string) error {
	fs := a.newFlagSet("create", "[flags]")
	var (
		req          client.CreateSandboxRequest
		env, meta    = pairs{}, pairs{}
		memory, cpus int
	)
	fs.StringVar(&req.Template, "template", "", "template `name`, such as minimal (default: the server's, base)")
	fs.IntVar(&req.TimeoutSeconds, "timeout", 0, "`seconds` until the sandbox expires (default: the server's)")
	fs.Var(env, "env", "environment variable `K=V` (repeatable)")
	fs.Var(meta, "meta", "metadata `k=v` (repeatable)")
	fs.IntVar(&memory, "memory", 0, "memory in `MiB`")
	fs.IntVar(&cpus, "vcpus", 0, "virtual CPUs")
	fs.StringVar(&req.FromSnapshot, "from-snapshot", "", "make the sandbox from `snapshot` (a full one brings its processes)")
	pos, _, err := parseArgs(fs, args, -1)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("create takes no arguments, got %q", pos)
	}
	if req.TimeoutSeconds < 0 || memory < 0 || cpus < 0 {
		return usagef("--timeout, --memory and --vcpus must not be negative")
	}
	req.Env, req.Metadata = env.orNil(), meta.orNil()
	if memory > 0 || cpus > 0 {
		req.Resources = &client.Resources{MemoryMiB: memory, VCPUs: cpus}
	}
	c, err := a.connect()
	if err != nil {
		return err
	}
	// A create waits for its template: base is built on spaced's first start, for minutes.
	template := req.Template
	if template == "" && req.FromSnapshot == "" {
		template = "base"
	}
	created := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { a.noteSlowCreate(c, template, created) })
	sb, err := c.CreateSandbox(a.ctx, req)
	close(created)
	wg.Wait()
	if err != nil {
		return err
	}
	if a.global.json {
		return a.printJSON(sb)
	}
	fmt.Fprintln(a.stdout, sb.ID)
	return nil
}

// noteSlowCreate says on stderr what a create that has not answered after a few seconds waits
// for, and then how long it has waited, every half minute, until created is closed: while its
// template is being built, how far along the build is (GET /v1/info "builds").
func (a *app) noteSlowCreate(c *client.Client, template string, created <-chan struct{}) {
	first, every := a.slowAfter, 30*time.Second
	if first == 0 {
		first = 3 * time.Second
	} else {
		every = first
	}
	start := time.Now()
	timer := time.NewTimer(first)
	defer timer.Stop()
	select {
	case <-created:
		return
	case <-timer.C:
	}
	msg := "space: waiting for the server to start the sandbox"
	building := template != "" && !a.templateBuilt(c, template)
	if building {
		msg = fmt.Sprintf("space: template %s is not built yet; the server is building it (base takes a few minutes "+
			"on spaced's first start)", template)
		if p := a.buildProgress(c, template); p != "" {
			msg += ": " + p
		}
	}
	fmt.Fprintln(a.stderr, msg)
	ticker := time.NewTicker(every)
	defer ticker.Stop()
	for {
		select {
		case <-created:
			return
		case <-ticker.C:
			line := fmt.Sprintf("space: still waiting (%s)", time.Since(start).Round(time.Second))
			if building {
				if p := a.buildProgress(c, template); p != "" {
					line += ": " + p
				}
			}
			fmt.Fprintln(a.stderr, line)
		}
	}
}

// buildProgress describes the server's build of template, or "" if it reports none.
func (a *app) buildProgress(c *client.Client, template string) string {
	ctx, cancel := context.WithTimeout(a.ctx, 5*time.Second)
	defer cancel()
	info, err := c.Info(ctx)
	if err != nil {
		return ""
	}
	for _, b := range info.Builds {
		if b.Template != template {
			continue
		}
		s := "building " + template
		if b.Step != "" {
			s += ", " + b.Step
		}
		if b.Total > 0 {
			s += fmt.Sprintf(", %d of %d done", b.Done, b.Total)
		}
		return s
	}
	return ""
}

// templateBuilt reports whether the server lists template as built; when it cannot tell, true
// (the note then claims nothing about the template).
func (a *app) templateBuilt(c *client.Client, template string) bool {
	ctx, cancel := context.WithTimeout(a.ctx, 5*time.Second)
	defer cancel()
	list, err := c.ListTemplates(ctx)
	if err != nil {
		return true
	}
	for _, t := range list {
		if t.Name == template {
			return true
		}
	}
	return false
}

func (a *app) cmdList(args []string) error {
	fs := a.newFlagSet("ls", "[flags]")
	var (
		opts client.ListSandboxesOptions
		meta = pairs{}
	)
	fs.StringVar(&opts.State, "state", "", "only sandboxes in this `state` (running, paused, …)")
	fs.Var(meta, "meta", "only sandboxes with metadata `k=v` (repeatable; all must match)")
	pos, _, err := parseArgs(fs, args, -1)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("ls takes no arguments, got %q", pos)
	}
	opts.Metadata = meta.orNil()
	c, err := a.connect()
	if err != nil {
		return err
	}
	list, err := c.ListSandboxes(a.ctx, opts)
	if err != nil {
		return err
	}
	if a.global.json {
		if list == nil {
			list = []client.Sandbox{}
		}
		return a.printJSON(list)
	}
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATE\tTEMPLATE\tRUNTIME\tCREATED\tEXPIRES\tMETADATA")
	for _, sb := range list {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", sb.ID, sb.State, dash(sb.Template), dash(sb.Runtime),
			formatTime(sb.CreatedAt), formatTime(sb.ExpiresAt), dash(pairs(sb.Metadata).String()))
	}
	return tw.Flush()
}

func (a *app) cmdInfo(args []string) error {
	fs := a.newFlagSet("info", "[ID]")
	pos, _, err := parseArgs(fs, args, -1)
	if err != nil {
		return err
	}
	if len(pos) > 1 {
		return usagef("info takes at most one sandbox ID")
	}
	c, err := a.connect()
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		info, err := c.Info(a.ctx)
		if err != nil {
			return err
		}
		if a.global.json {
			return a.printJSON(info)
		}
		printServerInfo(a.stdout, info)
		return nil
	}
	return a.showSandbox(c.GetSandbox(a.ctx, pos[0]))
}

func (a *app) cmdRemove(args []string) error {
	fs := a.newFlagSet("rm", "ID...")
	ids, _, err := parseArgs(fs, args, -1)
	if err != nil {
		return err
	}
	if len(ids) == 0 {
		return usagef("rm needs at least one sandbox ID")
	}
	c, err := a.connect()
	if err != nil {
		return err
	}
	// Delete every one asked for, report each failure, and fail if any failed.
	deleted := []string{}
	var failed error
	for _, id := range ids {
		if err := c.DeleteSandbox(a.ctx, id); err != nil {
			failed = err
			a.report(fmt.Errorf("%s: %w", id, errMessage(err)))
			continue
		}
		deleted = append(deleted, id)
		if !a.global.json {
			fmt.Fprintln(a.stdout, id)
		}
	}
	if a.global.json {
		if err := a.printJSON(deleted); err != nil {
			return err
		}
	}
	if failed != nil {
		return exitCode(exitError)
	}
	return nil
}

// errMessage replaces an API error by its bare message, for prefixed reports.
func errMessage(err error) error {
	if e, ok := err.(*client.Error); ok {
		return fmt.Errorf("%s", e.Message)
	}
	return err
}

func (a *app) printJSON(v any) error {
	enc := json.NewEncoder(a.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func formatTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func printSandbox(w io.Writer, sb *client.Sandbox) {
	tw := tabwriter.NewWriter(w, 0, 4, 1, ' ', 0)
	row := func(k, v string) { fmt.Fprintf(tw, "%s:\t%s\n", k, v) }
	row("ID", sb.ID)
	row("State", sb.State)
	row("Template", dash(sb.Template))
	row("Runtime", dash(sb.Runtime))
	row("Created", formatTime(sb.CreatedAt))
	row("Expires", formatTime(sb.ExpiresAt))
	row("Metadata", dash(pairs(sb.Metadata).String()))
	if r := sb.Resources; r != nil {
		row("Resources", fmt.Sprintf("%d vCPU, %d MiB memory, %d MiB disk", r.VCPUs, r.MemoryMiB, r.DiskMiB))
	}
	if n := sb.Network; n != nil {
		if e := n.Egress; e != nil {
			s := "default " + dash(e.Default)
			if len(e.Allow) > 0 {
				s += "; allow " + strings.Join(e.Allow, ", ")
			}
			if len(e.Deny) > 0 {
				s += "; deny " + strings.Join(e.Deny, ", ")
			}
			row("Egress", s)
		}
		if len(n.Credentials) > 0 {
			row("Credentials", strings.Join(n.Credentials, ", "))
		}
	}
	if p := sb.Parent; p != nil && (p.SandboxID != "" || p.SnapshotID != "") {
		row("Parent", strings.TrimSpace(strings.Join([]string{p.SandboxID, p.SnapshotID}, " ")))
	}
	tw.Flush()
}

func printServerInfo(w io.Writer, info *client.Info) {
	fmt.Fprintf(w, "Version:          %s\nDefault runtime:  %s\n", dash(info.Version), dash(info.DefaultRuntime))
	rts := append([]client.RuntimeInfo(nil), info.Runtimes...)
	sort.SliceStable(rts, func(i, j int) bool { return rts[i].Name < rts[j].Name })
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "\nRUNTIME\tAVAILABLE\tREASON")
	for _, r := range rts {
		avail := "no"
		if r.Available {
			avail = "yes"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", r.Name, avail, dash(r.Reason))
	}
	tw.Flush()
}
