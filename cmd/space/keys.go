package main

import (
	"fmt"
	"text/tabwriter"
)

// cmdKey: space key create TENANT | ls | rm KEY_ID... (also spelled `space keys`). Admin only.
func (a *app) cmdKey(args []string) error {
	const usage = "usage: space key create TENANT | ls | rm KEY_ID..."
	fs := a.newFlagSet("key", "create TENANT | ls | rm KEY_ID...")
	pos, _, err := parseArgs(fs, args, -1)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		return usagef(usage)
	}
	switch {
	case pos[0] == "create" && len(pos) == 2:
	case pos[0] == "ls" && len(pos) == 1:
	case pos[0] == "rm" && len(pos) >= 2:
	default:
		return usagef(usage)
	}
	c, err := a.connect()
	if err != nil {
		return err
	}
	switch pos[0] {
	case "create":
		k, err := c.CreateKey(a.ctx, pos[1])
		if err != nil {
			return err
		}
		if a.global.json {
			return a.printJSON(k)
		}
		fmt.Fprintln(a.stdout, k.Key)
		return nil
	case "ls":
		list, err := c.ListKeys(a.ctx)
		if err != nil {
			return err
		}
		if a.global.json {
			return a.printJSON(list)
		}
		tw := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tTENANT\tADMIN\tCREATED")
		for _, k := range list {
			fmt.Fprintf(tw, "%s\t%s\t%v\t%s\n", k.ID, k.Tenant, k.Admin, formatTime(k.CreatedAt))
		}
		return tw.Flush()
	default: // rm
		for _, id := range pos[1:] {
			if err := c.RevokeKey(a.ctx, id); err != nil {
				return err
			}
			if !a.global.json {
				fmt.Fprintln(a.stdout, id)
			}
		}
		return nil
	}
}
