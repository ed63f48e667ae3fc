// Package config is spaced's one typed configuration: loaded from flags and the environment in
// one place (Load), validated, and passed down to constructors. No other package reads the
// environment. Imported only by cmd/spaced.
package config

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/space-sandbox/space/internal/crashpoint"
)

// Config is spaced's configuration.
type Config struct {
	Home      string // SPACE_HOME: state directory
	Listen    string // SPACE_LISTEN: API address
	AdminKey  string // SPACE_ADMIN_KEY: admin API key to install at start (optional)
	EgressDNS string // SPACE_EGRESS_DNS: upstream resolver ip:port for the egress gateway
	EgressCA  string // SPACE_EGRESS_CA: extra PEM roots for the gateway
	// The egress gateway's per-sandbox limits (bursts are twice the rates).
	EgressMaxConns int           // SPACE_EGRESS_MAX_CONNS: connections open at once
	EgressConnRate int           // SPACE_EGRESS_CONN_RATE: new connections per second
	EgressDNSRate  int           // SPACE_EGRESS_DNS_RATE: DNS queries per second
	EgressIdle     time.Duration // SPACE_EGRESS_IDLE: a connection silent both ways this long is closed
	Domain         string        // SPACE_DOMAIN: E2B sandbox domain (envd at 49983-<id>.<domain>)
	DefaultEgress  string        // SPACE_DEFAULT_EGRESS: deny|allow
	Instance       string        // SPACE_INSTANCE: 4 hex chars naming this instance's host objects; default from Home
	SlotCIDR       netip.Prefix  // SPACE_SLOT_CIDR: range network slots are carved from
	SlotPool       int           // SPACE_SLOT_POOL: slots kept ready
	Runsc          string        // SPACE_RUNSC: runsc binary
	Agent          string        // SPACE_AGENT: space-agent binary
	Busybox        string        // SPACE_BUSYBOX: static busybox for the minimal template
	TemplatesDir   string        // SPACE_TEMPLATES_DIR: where templates live; default $SPACE_HOME/templates
	DefaultTTL     time.Duration // default sandbox timeout
	MaxTTL         time.Duration // largest timeout a client may ask for
	MaxSandboxes   int           // SPACE_MAX_SANDBOXES: per-tenant cap on live sandboxes
	WarmPool       int           // SPACE_WARM_POOL: default-shape sandboxes started ahead of demand
	// WarmTemplates (SPACE_WARM_POOL_TEMPLATES, "name=count,..."): warm pools of other templates.
	WarmTemplates map[string]int
	ExecSpoolMiB  int64  // SPACE_EXEC_SPOOL_MIB: disk under $SPACE_HOME/spool for running commands' output
	LogLevel      string // SPACE_LOG_LEVEL: debug|info|warn|error
	Debug         bool   // SPACE_DEBUG: runsc debug logs
	// CrashAt (SPACE_CRASH_AT), for the crash-point tests only: spaced kills itself with SIGKILL
	// when an operation reaches this step (internal/crashpoint). Empty in production.
	CrashAt string
}

var instanceRE = regexp.MustCompile(`^[0-9a-f]{4}$`)

// Load parses args (flags after "serve") with the environment as defaults.
func Load(args []string, getenv func(string) string) (Config, error) {
	env := func(k, def string) string {
		if v := getenv(k); v != "" {
			return v
		}
		return def
	}
	exeDir := "."
	if exe, err := os.Executable(); err == nil {
		exeDir = filepath.Dir(exe)
	}
	var c Config
	var cidr string
	fs := flag.NewFlagSet("spaced serve", flag.ContinueOnError)
	fs.StringVar(&c.Home, "home", env("SPACE_HOME", "./.space"), "state directory (SPACE_HOME)")
	fs.StringVar(&c.Listen, "listen", env("SPACE_LISTEN", "127.0.0.1:7070"), "API address (SPACE_LISTEN)")
	fs.StringVar(&c.AdminKey, "admin-key", env("SPACE_ADMIN_KEY", ""), "admin API key (SPACE_ADMIN_KEY)")
	fs.StringVar(&c.EgressDNS, "egress-dns", env("SPACE_EGRESS_DNS", ""), "upstream resolver ip:port (SPACE_EGRESS_DNS)")
	fs.StringVar(&c.EgressCA, "egress-ca", env("SPACE_EGRESS_CA", ""), "extra PEM roots for the gateway (SPACE_EGRESS_CA)")
	fs.IntVar(&c.EgressMaxConns, "egress-max-conns", atoiDefault(env("SPACE_EGRESS_MAX_CONNS", ""), 256), "egress connections a sandbox may hold open (SPACE_EGRESS_MAX_CONNS)")
	fs.IntVar(&c.EgressConnRate, "egress-conn-rate", atoiDefault(env("SPACE_EGRESS_CONN_RATE", ""), 100), "new egress connections per second per sandbox, bursts of twice that (SPACE_EGRESS_CONN_RATE)")
	fs.IntVar(&c.EgressDNSRate, "egress-dns-rate", atoiDefault(env("SPACE_EGRESS_DNS_RATE", ""), 50), "DNS queries per second per sandbox, bursts of twice that (SPACE_EGRESS_DNS_RATE)")
	idle, idleErr := time.ParseDuration(env("SPACE_EGRESS_IDLE", "5m"))
	fs.DurationVar(&c.EgressIdle, "egress-idle", idle, "egress connections silent both ways this long are closed (SPACE_EGRESS_IDLE)")
	fs.StringVar(&c.Domain, "domain", env("SPACE_DOMAIN", ""), "E2B sandbox domain: envd of sandbox <id> at 49983-<id>.<domain> (SPACE_DOMAIN)")
	fs.StringVar(&c.DefaultEgress, "default-egress", env("SPACE_DEFAULT_EGRESS", "deny"), "deny|allow (SPACE_DEFAULT_EGRESS)")
	fs.StringVar(&c.Instance, "instance", env("SPACE_INSTANCE", ""), "4-hex instance id (SPACE_INSTANCE); default derived from the home")
	fs.StringVar(&cidr, "slot-cidr", env("SPACE_SLOT_CIDR", "10.211.0.0/16"), "network slot range (SPACE_SLOT_CIDR)")
	fs.IntVar(&c.SlotPool, "slot-pool", atoiDefault(env("SPACE_SLOT_POOL", ""), 4), "network slots kept ready (SPACE_SLOT_POOL)")
	fs.StringVar(&c.Runsc, "runsc", env("SPACE_RUNSC", filepath.Join(exeDir, "runsc")), "runsc binary (SPACE_RUNSC)")
	fs.StringVar(&c.Agent, "agent", env("SPACE_AGENT", filepath.Join(exeDir, "space-agent")), "space-agent binary (SPACE_AGENT)")
	fs.StringVar(&c.TemplatesDir, "templates-dir", env("SPACE_TEMPLATES_DIR", ""), "where templates live; default $SPACE_HOME/templates (SPACE_TEMPLATES_DIR)")
	fs.StringVar(&c.Busybox, "busybox", env("SPACE_BUSYBOX", "/bin/busybox"), "static busybox (SPACE_BUSYBOX)")
	fs.DurationVar(&c.DefaultTTL, "default-timeout", 300*time.Second, "default sandbox timeout")
	fs.DurationVar(&c.MaxTTL, "max-timeout", 24*time.Hour, "largest sandbox timeout")
	fs.IntVar(&c.MaxSandboxes, "max-sandboxes", atoiDefault(env("SPACE_MAX_SANDBOXES", ""), 100), "live sandboxes per tenant (SPACE_MAX_SANDBOXES)")
	fs.IntVar(&c.WarmPool, "warm-pool", atoiDefault(env("SPACE_WARM_POOL", ""), 2), "default-shape sandboxes kept started ahead of demand; 0 disables (SPACE_WARM_POOL)")
	warmTemplates := fs.String("warm-pool-templates", env("SPACE_WARM_POOL_TEMPLATES", "code-interpreter=1"), "warm pools of other templates, name=count,... or none (SPACE_WARM_POOL_TEMPLATES)")
	fs.Int64Var(&c.ExecSpoolMiB, "exec-spool-mib", int64(atoiDefault(env("SPACE_EXEC_SPOOL_MIB", ""), 1024)), "MiB of disk under $SPACE_HOME/spool that the output of commands answered as one JSON object may hold at once (SPACE_EXEC_SPOOL_MIB)")
	fs.StringVar(&c.LogLevel, "log-level", env("SPACE_LOG_LEVEL", "info"), "debug|info|warn|error (SPACE_LOG_LEVEL)")
	fs.BoolVar(&c.Debug, "debug", env("SPACE_DEBUG", "") == "1", "runsc debug logs (SPACE_DEBUG=1)")
	c.CrashAt = getenv("SPACE_CRASH_AT")
	if err := fs.Parse(args); err != nil {
		return Config{}, err
	}
	var err error
	if c.WarmTemplates, err = parseWarmTemplates(*warmTemplates); err != nil {
		return Config{}, err
	}
	if fs.NArg() > 0 {
		return Config{}, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	if idleErr != nil {
		return Config{}, fmt.Errorf("SPACE_EGRESS_IDLE: %w", idleErr)
	}
	p, err := netip.ParsePrefix(cidr)
	if err != nil {
		return Config{}, fmt.Errorf("slot cidr: %w", err)
	}
	c.SlotCIDR = p.Masked()
	abs, err := filepath.Abs(c.Home)
	if err != nil {
		return Config{}, fmt.Errorf("home: %w", err)
	}
	c.Home = abs
	if c.TemplatesDir == "" {
		c.TemplatesDir = filepath.Join(c.Home, "templates")
	}
	if c.TemplatesDir, err = filepath.Abs(c.TemplatesDir); err != nil {
		return Config{}, fmt.Errorf("templates dir: %w", err)
	}
	if c.Instance == "" {
		sum := sha256.Sum256([]byte(c.Home))
		c.Instance = hex.EncodeToString(sum[:2])
	}
	return c, c.Validate()
}

// Validate checks the values that Load cannot check by parsing alone.
func (c Config) Validate() error {
	var errs []error
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		errs = append(errs, fmt.Errorf("listen %q: %w", c.Listen, err))
	}
	if c.DefaultEgress != "deny" && c.DefaultEgress != "allow" {
		errs = append(errs, fmt.Errorf("default egress %q: want deny or allow", c.DefaultEgress))
	}
	if c.EgressDNS != "" {
		if _, err := netip.ParseAddrPort(c.EgressDNS); err != nil {
			errs = append(errs, fmt.Errorf("egress dns %q: want ip:port: %w", c.EgressDNS, err))
		}
	}
	if c.EgressMaxConns < 1 || c.EgressMaxConns > 65536 || c.EgressConnRate < 1 || c.EgressConnRate > 100000 || c.EgressDNSRate < 1 || c.EgressDNSRate > 100000 {
		errs = append(errs, fmt.Errorf("egress limits (max conns %d, conn rate %d, dns rate %d): want 1..65536, 1..100000, 1..100000", c.EgressMaxConns, c.EgressConnRate, c.EgressDNSRate))
	}
	if c.EgressIdle < time.Second {
		errs = append(errs, fmt.Errorf("egress idle %s: want at least 1s", c.EgressIdle))
	}
	if !instanceRE.MatchString(c.Instance) {
		errs = append(errs, fmt.Errorf("instance %q: want 4 lowercase hex characters", c.Instance))
	}
	if !c.SlotCIDR.Addr().Is4() || c.SlotCIDR.Bits() > 28 {
		errs = append(errs, fmt.Errorf("slot cidr %s: want an IPv4 range of /28 or larger", c.SlotCIDR))
	}
	if c.SlotPool < 0 || c.SlotPool > 256 {
		errs = append(errs, fmt.Errorf("slot pool %d: want 0..256", c.SlotPool))
	}
	if c.DefaultTTL <= 0 || c.MaxTTL < c.DefaultTTL {
		errs = append(errs, fmt.Errorf("timeouts: want 0 < default (%s) <= max (%s)", c.DefaultTTL, c.MaxTTL))
	}
	if c.ExecSpoolMiB < 1 || c.ExecSpoolMiB > 1<<20 {
		errs = append(errs, fmt.Errorf("exec spool %d MiB: want 1..1048576", c.ExecSpoolMiB))
	}
	if c.WarmPool < 0 || c.WarmPool > 64 {
		errs = append(errs, fmt.Errorf("warm pool %d: want 0..64", c.WarmPool))
	}

	if c.MaxSandboxes <= 0 {
		errs = append(errs, fmt.Errorf("max sandboxes %d: want > 0", c.MaxSandboxes))
	}
	if c.CrashAt != "" && !crashpoint.Valid(c.CrashAt) {
		errs = append(errs, fmt.Errorf("crash point %q: not a step (internal/crashpoint)", c.CrashAt))
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		errs = append(errs, fmt.Errorf("log level %q: want debug|info|warn|error", c.LogLevel))
	}
	return errors.Join(errs...)
}

func atoiDefault(s string, def int) int {
	var n int
	if _, err := fmt.Sscanf(s, "%d", &n); err != nil {
		return def
	}
	return n
}

// parseWarmTemplates parses "name=count,..." (template names as templates have them, counts
// 0..64) or "none".
func parseWarmTemplates(s string) (map[string]int, error) {
	out := map[string]int{}
	if strings.TrimSpace(s) == "none" {
		return out, nil
	}
	for item := range strings.SplitSeq(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		name, count, ok := strings.Cut(item, "=")
		n, err := strconv.Atoi(count)
		if !ok || err != nil || n < 0 || n > 64 || !templateNameRE.MatchString(name) {
			return nil, fmt.Errorf("warm pool templates %q: want name=count (0..64), comma-separated", item)
		}
		out[name] = n
	}
	return out, nil
}

var templateNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)
