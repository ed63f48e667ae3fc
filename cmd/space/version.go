package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/space-sandbox/space/pkg/client"
)

// cmdVersion: space version. It prints the CLI's version and, when the server answers, the
// server's (GET /v1/info, which needs a key); a server that does not answer is noted on stderr
// and is not an error.
func (a *app) cmdVersion(args []string) error {
	fs := a.newFlagSet("version", "")
	pos, _, err := parseArgs(fs, args, -1)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("version takes no arguments")
	}
	c, err := a.connect()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(a.ctx, 5*time.Second)
	defer cancel()
	var server string
	info, serr := c.Info(ctx)
	if serr == nil {
		server = info.Version
	}
	if a.global.json {
		out := struct {
			CLI    string `json:"cli"`
			Server string `json:"server,omitempty"`
			URL    string `json:"url"`
			Error  string `json:"server_error,omitempty"`
		}{CLI: version, Server: server, URL: a.server}
		if serr != nil {
			out.Error = serr.Error()
		}
		return a.printJSON(out)
	}
	fmt.Fprintf(a.stdout, "space %s\n", version)
	if serr != nil {
		fmt.Fprintf(a.stderr, "space: server %s: %v\n", a.server, serr)
		if ae := (*client.Error)(nil); errors.As(serr, &ae) && ae.Status == http.StatusUnauthorized {
			fmt.Fprintln(a.stderr, a.keyHint())
		}
		return nil
	}
	fmt.Fprintf(a.stdout, "spaced %s (%s)\n", server, a.server)
	return nil
}
