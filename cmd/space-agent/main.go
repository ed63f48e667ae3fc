// Command space-agent is the init process (PID 1) of every SPACE sandbox. It mounts what a bare
// VM kernel leaves unmounted, reaps orphans, and serves the agent protocol (Connect-RPC
// process.Process and filesystem.Filesystem, HTTP /files and /health; see internal/agent/server)
// on port 49983. It is built as one static binary (CGO_ENABLED=0).
//
// Configuration, read here and nowhere else:
//
//	-addr / SPACE_AGENT_ADDR              listen address (default 0.0.0.0:49983)
//	SPACE_AGENT_TOKEN                     access token required in X-Access-Token
//	SPACE_AGENT_TOKEN_FILE                file holding the token (used if SPACE_AGENT_TOKEN is unset)
//	-log-level / SPACE_AGENT_LOG_LEVEL    debug, info, warn, error (default info)
//
// Every SPACE_AGENT_* variable is removed from the agent's environment at startup, so no
// command it runs inherits the token.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/space-sandbox/space/internal/agent/server"
)

const defaultAddr = "0.0.0.0:49983"

// config is the agent's typed configuration.
type config struct {
	addr     string
	token    string
	logLevel slog.Level
	baseEnv  []string
}

// loadConfig reads flags and the environment. It does not modify the process environment.
func loadConfig(args, environ []string) (config, error) {
	env := map[string]string{}
	var base []string
	for _, kv := range environ {
		k, v, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "SPACE_AGENT_") {
			env[k] = v
			continue
		}
		base = append(base, kv)
	}
	fs := flag.NewFlagSet("space-agent", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	addr := fs.String("addr", orDefault(env["SPACE_AGENT_ADDR"], defaultAddr), "listen address")
	level := fs.String("log-level", orDefault(env["SPACE_AGENT_LOG_LEVEL"], "info"), "log level")
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	cfg := config{addr: *addr, token: env["SPACE_AGENT_TOKEN"], baseEnv: base}
	if err := cfg.logLevel.UnmarshalText([]byte(*level)); err != nil {
		return config{}, fmt.Errorf("log level: %w", err)
	}
	if cfg.token == "" && env["SPACE_AGENT_TOKEN_FILE"] != "" {
		b, err := os.ReadFile(env["SPACE_AGENT_TOKEN_FILE"])
		if err != nil {
			return config{}, fmt.Errorf("token file: %w", err)
		}
		cfg.token = strings.TrimSpace(string(b))
	}
	return cfg, nil
}

func orDefault(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

func main() {
	os.Exit(run())
}

func run() int {
	cfg, err := loadConfig(os.Args[1:], os.Environ())
	if err != nil {
		fmt.Fprintln(os.Stderr, "space-agent:", err)
		return 2
	}
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "SPACE_AGENT_") {
			_ = os.Unsetenv(k)
		}
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: cfg.logLevel}))
	isInit := os.Getpid() == 1
	if isInit {
		mountEssentials(log)
	}
	srv, err := server.New(server.Config{
		Token:   cfg.token,
		BaseEnv: cfg.baseEnv,
		ReapAll: isInit,
		Logger:  log,
	})
	if err != nil {
		log.Error("start", "err", err)
		return 1
	}
	defer srv.Close()

	ln, err := net.Listen("tcp", cfg.addr)
	if err != nil {
		log.Error("listen", "addr", cfg.addr, "err", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	log.Info("space-agent listening", "addr", ln.Addr().String(), "pid", os.Getpid(), "auth", cfg.token != "")
	if err := srv.Serve(ctx, ln); err != nil && !errors.Is(err, context.Canceled) {
		log.Error("serve", "err", err)
		return 1
	}
	// Give the sandbox's processes a moment to exit on their own terms.
	srv.SignalAll(syscall.SIGTERM)
	time.Sleep(100 * time.Millisecond)
	log.Info("space-agent stopped")
	return 0
}
