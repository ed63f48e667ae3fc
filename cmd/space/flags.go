package main

import (
	"errors"
	"flag"
	"fmt"
	"sort"
	"strings"
)

var (
	errHelp = flag.ErrHelp
	// errFlagParse marks an error the flag package has already printed, with the usage.
	errFlagParse = errors.New("bad flags")
)

// globalFlags are accepted before the command and among every command's flags.
type globalFlags struct {
	url  string
	key  string
	json bool
}

// newFlagSet returns a flag set for the command name that also accepts the global flags.
func (a *app) newFlagSet(name, usage string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(a.stderr)
	fs.Usage = func() {
		fmt.Fprintf(a.stderr, "usage: space %s %s\n", name, usage)
		fs.PrintDefaults()
	}
	fs.StringVar(&a.global.url, "url", a.global.url, "server `URL` (default $SPACE_URL or "+defaultURL+")")
	fs.StringVar(&a.global.key, "key", a.global.key, "API `key` (default $SPACE_API_KEY or $SPACE_HOME/admin.key)")
	fs.BoolVar(&a.global.json, "json", a.global.json, "print JSON for machines")
	return fs
}

// parseArgs parses fs's flags wherever they appear among the positional arguments. Everything
// after "--" is returned in rest untouched. With maxPos >= 0, parsing also stops at the first
// positional argument past maxPos of them, which starts rest (so that `exec ID ls -l` leaves
// "-l" to ls).
func parseArgs(fs *flag.FlagSet, args []string, maxPos int) (pos, rest []string, err error) {
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, nil, errHelp
			}
			return nil, nil, errFlagParse
		}
		remaining := fs.Args()
		if consumed := len(args) - len(remaining); consumed > 0 && args[consumed-1] == "--" {
			return pos, remaining, nil
		}
		if len(remaining) == 0 {
			return pos, nil, nil
		}
		if maxPos >= 0 && len(pos) == maxPos {
			return pos, remaining, nil
		}
		pos = append(pos, remaining[0])
		args = remaining[1:]
	}
}

// pairs is a repeatable K=V flag.
type pairs map[string]string

func (p pairs) String() string {
	keys := make([]string, 0, len(p))
	for k := range p {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(k + "=" + p[k])
	}
	return b.String()
}

func (p pairs) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return fmt.Errorf("want KEY=VALUE, got %q", s)
	}
	p[k] = v
	return nil
}

// orNil returns nil for an empty map, so that empty flags are left out of requests.
func (p pairs) orNil() map[string]string {
	if len(p) == 0 {
		return nil
	}
	return p
}
