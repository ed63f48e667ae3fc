package main

import (
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/space-sandbox/space/pkg/client"
)

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

func (a *app) cmdSnapshot(args []string) error {
	fs := a.newFlagSet("snapshot", "ID [--full] [--label L]")
	full := fs.Bool("full", false, "save memory and processes too, not only files")
	label := fs.String("label", "", "a `label` to find the snapshot by")
	pos, _, err := parseArgs(fs, args, -1)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("usage: space snapshot ID [--full] [--label L]")
	}
	kind := client.SnapshotFilesystem
	if *full {
		kind = client.SnapshotFull
	}
	c, err := a.connect()
	if err != nil {
		return err
	}
	s, err := c.CreateSnapshot(a.ctx, pos[0], kind, *label)
	if err != nil {
		return err
	}
	if a.global.json {
		return a.printJSON(s)
	}
	fmt.Fprintln(a.stdout, s.ID)
	fmt.Fprintf(a.stderr, "%s snapshot of %s: %s, %s newly stored\n", s.Kind, s.SandboxID, mib(s.SizeBytes), mib(s.StoredBytes))
	return nil
}

// cmdSnapshots lists snapshots (of one sandbox or all) or, with rm, deletes them.
func (a *app) cmdSnapshots(args []string) error {
	c, err := a.connect()
	if err != nil {
		return err
	}
	if len(args) > 0 && args[0] == "rm" {
		if len(args) < 2 {
			return usagef("usage: space snapshots rm SNAPSHOT...")
		}
		for _, sid := range args[1:] {
			if err := c.DeleteSnapshot(a.ctx, sid); err != nil {
				return err
			}
		}
		return nil
	}
	if len(args) > 1 {
		return usagef("usage: space snapshots [ID] | rm SNAPSHOT...")
	}
	id := ""
	if len(args) == 1 {
		id = args[0]
	}
	list, err := c.ListSnapshots(a.ctx, id)
	if err != nil {
		return err
	}
	if a.global.json {
		return a.printJSON(list)
	}
	tw := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSANDBOX\tKIND\tLABEL\tCREATED\tSIZE\tSTORED\tPARENT")
	for _, s := range list {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.ID, s.SandboxID, s.Kind, dash(s.Label), formatTime(s.CreatedAt),
			mib(s.SizeBytes), mib(s.StoredBytes), dash(s.ParentID))
	}
	return tw.Flush()
}

func (a *app) cmdRestore(args []string) error {
	fs := a.newFlagSet("restore", "ID SNAPSHOT [PATH...]")
	pos, _, err := parseArgs(fs, args, -1)
	if err != nil {
		return err
	}
	if len(pos) < 2 {
		return usagef("usage: space restore ID SNAPSHOT [PATH...]")
	}
	c, err := a.connect()
	if err != nil {
		return err
	}
	return a.showSandbox(c.Restore(a.ctx, pos[0], pos[1], pos[2:]...))
}

func (a *app) cmdLineage(args []string) error {
	if len(args) != 1 {
		return usagef("usage: space lineage ID")
	}
	c, err := a.connect()
	if err != nil {
		return err
	}
	nodes, err := c.Lineage(a.ctx, args[0])
	if err != nil {
		return err
	}
	if a.global.json {
		return a.printJSON(nodes)
	}
	printTree(a, nodes)
	return nil
}

// printTree prints nodes as an indented tree, children under their parent, oldest first.
func printTree(a *app, nodes []client.LineageNode) {
	kids := map[string][]client.LineageNode{}
	ids := map[string]bool{}
	for _, n := range nodes {
		ids[n.ID] = true
	}
	var roots []client.LineageNode
	for _, n := range nodes {
		if n.ParentID == "" || !ids[n.ParentID] {
			roots = append(roots, n)
		} else {
			kids[n.ParentID] = append(kids[n.ParentID], n)
		}
	}
	var walk func(n client.LineageNode, depth int)
	walk = func(n client.LineageNode, depth int) {
		extra := n.State
		if n.Kind == "snapshot" {
			extra = n.Label
		}
		if extra != "" {
			extra = "  (" + extra + ")"
		}
		fmt.Fprintf(a.stdout, "%s%s %s%s\n", strings.Repeat("  ", depth), n.Kind, n.ID, extra)
		for _, k := range kids[n.ID] {
			walk(k, depth+1)
		}
	}
	for _, r := range roots {
		walk(r, 0)
	}
}

func (a *app) cmdDiff(args []string) error {
	if len(args) != 2 {
		return usagef("usage: space diff SNAPSHOT AGAINST   (the changes from AGAINST to SNAPSHOT)")
	}
	c, err := a.connect()
	if err != nil {
		return err
	}
	changes, err := c.Diff(a.ctx, args[0], args[1])
	if err != nil {
		return err
	}
	if a.global.json {
		return a.printJSON(changes)
	}
	for _, ch := range changes {
		fmt.Fprintf(a.stdout, "%s %s (%d bytes)\n", map[string]string{"added": "A", "modified": "M", "deleted": "D"}[ch.Op], ch.Path, ch.Size)
	}
	return nil
}
