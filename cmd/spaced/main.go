// Command spaced is SPACE's daemon: the control plane and the node in one process. `spaced serve`
// loads the configuration, installs the admin key, re-adopts sandboxes of an earlier run and
// serves the HTTP API until SIGINT or SIGTERM. Sandboxes outlive spaced. `spaced version` prints
// its version, `spaced help` (or -h, --help) its usage.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/space-sandbox/space/internal/api"
	"github.com/space-sandbox/space/internal/auth"
	"github.com/space-sandbox/space/internal/cas"
	"github.com/space-sandbox/space/internal/config"
	"github.com/space-sandbox/space/internal/crashpoint"
	"github.com/space-sandbox/space/internal/egress"
	"github.com/space-sandbox/space/internal/egress/credentials"
	"github.com/space-sandbox/space/internal/network"
	"github.com/space-sandbox/space/internal/runtime"
	"github.com/space-sandbox/space/internal/runtime/gvisor"
	"github.com/space-sandbox/space/internal/sandbox"
	"github.com/space-sandbox/space/internal/secrets"
	"github.com/space-sandbox/space/internal/store/sqlite"
	"github.com/space-sandbox/space/internal/template"
	"github.com/space-sandbox/space/internal/template/build"
)

// version is set at build time with -ldflags "-X main.version=…".
var version = "dev"

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

const usage = `usage: spaced COMMAND

commands:
  serve [flags]  serve the HTTP API (spaced serve -h lists the flags and their variables)
  version        print spaced's version
  help           print this
`

// run runs spaced with args (without the program name) and returns the exit status.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	case "version", "-version", "--version":
		fmt.Fprintf(stdout, "spaced %s\n", version)
		return 0
	case "serve":
	default:
		fmt.Fprintf(stderr, "spaced: unknown command %q (want serve or version; see spaced help)\n", args[0])
		return 2
	}
	cfg, err := config.Load(args[1:], os.Getenv)
	if errors.Is(err, flag.ErrHelp) {
		return 0 // the flag package has printed serve's flags
	}
	if err != nil {
		fmt.Fprintf(stderr, "spaced: %v\n", err)
		return 2
	}
	log := newLogger(cfg.LogLevel, stderr)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	// A shutdown that hangs is a bug: leave its evidence and go (sandboxes keep running, and
	// the next start recovers whatever was under way).
	var watchdog atomic.Pointer[time.Timer]
	stopWatch := context.AfterFunc(ctx, func() {
		watchdog.Store(time.AfterFunc(shutdownLimit, func() {
			var b strings.Builder
			_ = pprof.Lookup("goroutine").WriteTo(&b, 1)
			log.Error("shutdown did not finish in time; exiting", "limit", shutdownLimit, "goroutines", b.String())
			os.Exit(3)
		}))
	})
	defer func() {
		stopWatch()
		if t := watchdog.Load(); t != nil {
			t.Stop()
		}
	}()
	if err := serve(ctx, cfg, log); err != nil {
		log.Error("spaced stopped", "err", err)
		return 1
	}
	return 0
}

func newLogger(level string, w io.Writer) *slog.Logger {
	var l slog.Level
	_ = l.UnmarshalText([]byte(level))
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: l}))
}

// serve runs spaced until ctx ends.
func serve(ctx context.Context, cfg config.Config, log *slog.Logger) error {
	if os.Geteuid() != 0 {
		return errors.New("spaced needs root: it creates network namespaces and runs gVisor in root mode")
	}
	if err := os.MkdirAll(cfg.Home, 0o700); err != nil {
		return fmt.Errorf("home: %w", err)
	}
	// Keys, sandbox layers and templates live here: root's alone, whatever it was made with.
	if err := os.Chmod(cfg.Home, 0o700); err != nil {
		return fmt.Errorf("home: %w", err)
	}
	for _, p := range []string{cfg.Runsc, cfg.Agent} {
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("%w (run `make build` first, or set SPACE_RUNSC / SPACE_AGENT)", err)
		}
	}
	log.Info("starting spaced", "version", version, "home", cfg.Home, "listen", cfg.Listen, "instance", cfg.Instance)

	st, err := sqlite.Open(ctx, filepath.Join(cfg.Home, "space.db"), log)
	if err != nil {
		return fmt.Errorf("open store: %w", err)
	}
	defer st.Close()
	keys := auth.New(st)
	if path, err := keys.EnsureAdmin(ctx, cfg.Home, cfg.AdminKey); err != nil {
		return fmt.Errorf("admin key: %w", err)
	} else if path != "" {
		log.Info("generated admin key", "file", path)
	}

	templates, err := template.New(template.Config{Dir: cfg.TemplatesDir, UserDir: filepath.Join(cfg.Home, "templates"), Busybox: cfg.Busybox, Logger: log})
	if err != nil {
		return fmt.Errorf("templates: %w", err)
	}
	var reg runtime.Registry
	if err := reg.Register("gvisor", func(dir string, _ map[string]string) (runtime.Driver, error) {
		return gvisor.New(gvisor.Config{Runsc: cfg.Runsc, StateDir: dir, Instance: cfg.Instance, Debug: cfg.Debug, Logger: log})
	}); err != nil {
		return err
	}
	drivers := map[string]runtime.Driver{}
	for _, name := range reg.Names() {
		f, _ := reg.Lookup(name)
		d, err := f(filepath.Join(cfg.Home, "runtime", name), nil)
		if err != nil {
			return fmt.Errorf("runtime %s: %w", name, err)
		}
		drivers[name] = d
	}

	// The egress gateway: every sandbox's TCP and DNS out is redirected to it (network/nft.go).
	audit := egress.NewAudit()
	box, err := secrets.LoadOrCreate(cfg.Home)
	if err != nil {
		return err
	}
	ca, err := egress.LoadOrCreateCA(cfg.Home)
	if err != nil {
		return err
	}
	var extraRoots []byte
	if cfg.EgressCA != "" {
		if extraRoots, err = os.ReadFile(cfg.EgressCA); err != nil {
			return fmt.Errorf("SPACE_EGRESS_CA: %w", err)
		}
	}
	var mgrRef atomic.Pointer[sandbox.Manager]
	gw, err := egress.Start(egress.Config{
		Upstream: cfg.EgressDNS, Audit: audit, Logger: log.With("component", "egress"), CA: ca, ExtraRoots: extraRoots,
		Limits: egressLimits(cfg),
		Lookup: func(ip netip.Addr) (egress.Target, bool) {
			if m := mgrRef.Load(); m != nil {
				return m.EgressTarget(ip)
			}
			return egress.Target{}, false
		},
		Blocked: func() []netip.Prefix { return hostPrefixes(cfg.SlotCIDR) },
	})
	if err != nil {
		return err
	}
	defer gw.Close()

	pool, err := network.NewPool(ctx, network.Config{Instance: cfg.Instance, CIDR: cfg.SlotCIDR, PoolSize: cfg.SlotPool, Logger: log,
		Gateway: &network.GatewayPorts{Proxy: gw.ProxyPort(), DNS: gw.DNSPort()}})
	if err != nil {
		return fmt.Errorf("network: %w", err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := pool.Close(cctx); err != nil {
			log.Error("close network pool", "err", err)
		}
	}()

	chunks, err := cas.Open(filepath.Join(cfg.Home, "store"), log.With("component", "cas"))
	if err != nil {
		return fmt.Errorf("snapshot store: %w", err)
	}
	defer chunks.Close()

	vault := credentials.New(credentials.Config{Store: st, Box: box, Logger: log})
	crash := crashpoint.New(cfg.CrashAt, log) // nil unless a crash-point test asks
	mgr, err := sandbox.New(sandbox.Config{
		Store: st, Drivers: drivers, DefaultRuntime: "gvisor", Slots: pool, DefaultTemplate: "base",
		Capacity: func() (sandbox.Capacity, error) { return sandbox.HostCapacity(cfg.Home) },
		Templates: func(ctx context.Context, name string) (sandbox.Template, error) {
			t, err := templates.Ensure(ctx, name)
			return build.SandboxTemplate(t), err
		},
		AgentPath: cfg.Agent, Logger: log, DefaultTimeout: cfg.DefaultTTL, MaxTimeout: cfg.MaxTTL,
		MaxPerTenant: cfg.MaxSandboxes, DefaultEgress: cfg.DefaultEgress, WarmPool: cfg.WarmPool, WarmTemplates: cfg.WarmTemplates, StateDir: cfg.Home,
		Chunks: chunks, Audit: audit, EgressCA: ca.PEM(), Credentials: vault, Crash: crash,
		TemplateRefs: templates, Instance: cfg.Instance,
	})
	if err != nil {
		return err
	}
	mgrRef.Store(mgr)
	if err := mgr.Recover(ctx); err != nil {
		return err
	}
	mgr.Start()
	defer mgr.Close()
	// minimal (seconds) is ready before requests are served; base (minutes on first start) is
	// built in the background with progress in the log, and creates that need it wait for it.
	if _, err := templates.Ensure(ctx, "minimal"); err != nil {
		return fmt.Errorf("template minimal: %w", err)
	}
	baseDone := make(chan struct{})
	go func() {
		defer close(baseDone)
		if _, err := templates.Ensure(ctx, "base"); err != nil && ctx.Err() == nil {
			log.Error("template base could not be built; creates from it will retry", "err", err)
		}
	}()

	// Spool files are unlinked when made; whatever a crash left in the directory is stale.
	spoolDir := filepath.Join(cfg.Home, "spool")
	if err := os.RemoveAll(spoolDir); err != nil {
		return fmt.Errorf("spool: %w", err)
	}
	if err := os.Mkdir(spoolDir, 0o700); err != nil {
		return fmt.Errorf("spool: %w", err)
	}
	srv := &http.Server{
		Handler: api.New(api.Config{Sandboxes: mgr, Templates: build.New(build.Config{Lifecycle: mgr, Store: templates, Logger: log, Crash: crash}), Secrets: vault, Keys: keys, Logger: log, Version: version, Domain: cfg.Domain,
			SpoolDir: spoolDir, SpoolBytes: cfg.ExecSpoolMiB << 20}),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	log.Info("serving", "addr", ln.Addr().String())
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	// Within 2 s whatever is running (a supervisor's grace is often not much more), all at once:
	// requests get 0.4 s to finish, then their connections close; the manager starts nothing
	// new and leaves what is still under way after 0.8 s to the next start's recovery; a build
	// stops with ctx and gets 1.5 s to remove what it wrote (the next start sweeps the rest).
	log.Info("shutting down; sandboxes keep running")
	var wg sync.WaitGroup
	wg.Go(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 400*time.Millisecond)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil {
			log.Info("closing connections still open", "err", err)
			_ = srv.Close()
		}
	})
	wg.Go(mgr.Close)
	wg.Go(func() {
		select {
		case <-baseDone:
		case <-time.After(1500 * time.Millisecond):
			log.Warn("template build still cleaning up at exit; the next start sweeps what it left")
		}
	})
	wg.Wait()
	return nil
}

// shutdownLimit bounds a shutdown: it takes about 2 s (see serve).
const shutdownLimit = 15 * time.Second

// hostPrefixes are addresses the egress gateway never dials: every address of this host and
// the sandbox links.
func hostPrefixes(slots netip.Prefix) []netip.Prefix {
	out := []netip.Prefix{slots}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return out
	}
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil {
			out = append(out, netip.PrefixFrom(p.Addr().Unmap(), p.Addr().BitLen()))
		}
	}
	return out
}

// egressLimits are the gateway's limits from the configuration; all sandboxes together may hold
// connections for at most a quarter of spaced's descriptors (each costs two).
func egressLimits(cfg config.Config) egress.Limits {
	l := egress.Limits{
		MaxConns: cfg.EgressMaxConns, ConnRate: float64(cfg.EgressConnRate), ConnBurst: 2 * cfg.EgressConnRate,
		DNSRate: float64(cfg.EgressDNSRate), DNSBurst: 2 * cfg.EgressDNSRate, IdleTimeout: cfg.EgressIdle,
		MaxTotalConns: egress.DefaultLimits.MaxTotalConns,
	}
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err == nil && rl.Cur/4 < uint64(l.MaxTotalConns) {
		l.MaxTotalConns = max(int(rl.Cur/4), 64)
	}
	return l
}
