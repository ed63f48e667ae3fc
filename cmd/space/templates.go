package main

import (
	"encoding/base64"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/space-sandbox/space/pkg/client"
)

// cmdTemplate: space template ls | rm NAME... | build NAME --from PARENT [--run CMD]... [--env K=V]... [--workdir DIR] [--copy LOCAL:/path]...
// Steps keep the order in which their flags are given.
func (a *app) cmdTemplate(args []string) error {
	if len(args) == 0 {
		return usagef("usage: space template ls | rm NAME... | build NAME --from TEMPLATE [--run CMD] [--env K=V] [--workdir DIR] [--copy LOCAL:/PATH]")
	}
	c, err := a.connect()
	if err != nil {
		return err
	}
	switch args[0] {
	case "ls":
		list, err := c.ListTemplates(a.ctx)
		if err != nil {
			return err
		}
		if a.global.json {
			return a.printJSON(list)
		}
		tw := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "NAME\tSIZE\tCREATED\tPARENT")
		for _, t := range list {
			fmt.Fprintf(tw, "%s\t%.1f MiB\t%s\t%s\n", t.Name, float64(t.SizeBytes)/(1<<20), formatTime(t.CreatedAt), dash(t.Parent))
		}
		return tw.Flush()
	case "rm":
		if len(args) < 2 {
			return usagef("usage: space template rm NAME...")
		}
		for _, name := range args[1:] {
			if err := c.DeleteTemplate(a.ctx, name); err != nil {
				return err
			}
			if !a.global.json {
				fmt.Fprintln(a.stdout, name)
			}
		}
		return nil
	case "build":
		req, err := parseBuild(args[1:])
		if err != nil {
			return err
		}
		t, err := c.BuildTemplate(a.ctx, req, func(line string) { fmt.Fprintln(a.stderr, line) })
		if err != nil {
			return err
		}
		if a.global.json {
			return a.printJSON(t)
		}
		fmt.Fprintln(a.stdout, t.Name)
		return nil
	}
	return usagef("space template: unknown subcommand %q (want ls, rm or build)", args[0])
}

// parseBuild reads `NAME --from T` and ordered step flags.
func parseBuild(args []string) (client.BuildTemplateRequest, error) {
	var req client.BuildTemplateRequest
	for i := 0; i < len(args); i++ {
		arg := args[i]
		if !strings.HasPrefix(arg, "--") {
			if req.Name != "" {
				return req, usagef("template build: unexpected argument %q", arg)
			}
			req.Name = arg
			continue
		}
		if i+1 >= len(args) {
			return req, usagef("template build: %s needs a value", arg)
		}
		val := args[i+1]
		i++
		switch arg {
		case "--from":
			req.From.Template = val
		case "--image":
			req.From.Image = val
		case "--run":
			req.Steps = append(req.Steps, client.BuildStep{Run: val})
		case "--workdir":
			req.Steps = append(req.Steps, client.BuildStep{Workdir: val})
		case "--env":
			k, v, ok := strings.Cut(val, "=")
			if !ok || k == "" {
				return req, usagef("template build: --env wants K=V, got %q", val)
			}
			req.Steps = append(req.Steps, client.BuildStep{Env: map[string]string{k: v}})
		case "--copy":
			local, dest, ok := strings.Cut(val, ":")
			if !ok || !strings.HasPrefix(dest, "/") {
				return req, usagef("template build: --copy wants LOCAL:/ABSOLUTE/PATH, got %q", val)
			}
			b, err := os.ReadFile(local)
			if err != nil {
				return req, err
			}
			st, err := os.Stat(local)
			if err != nil {
				return req, err
			}
			req.Steps = append(req.Steps, client.BuildStep{Copy: &client.CopyStep{Path: dest, ContentB64: encodeB64(b), Mode: uint32(st.Mode().Perm())}})
		default:
			return req, usagef("template build: unknown flag %s", arg)
		}
	}
	if req.Name == "" || (req.From.Template == "") == (req.From.Image == "") {
		return req, usagef("usage: space template build NAME --from TEMPLATE [--run CMD] [--env K=V] [--workdir DIR] [--copy LOCAL:/PATH]")
	}
	return req, nil
}

func encodeB64(b []byte) string { return base64.StdEncoding.EncodeToString(b) }
