// Package server is the in-sandbox half of the agent protocol: the HTTP server of space-agent, the
// init process (PID 1) of every sandbox. It serves the Connect-RPC services process.Process and
// filesystem.Filesystem, plain HTTP GET|POST /files and GET /health, wire-compatible with E2B's
// envd, and it owns every child process of the sandbox: it starts them, streams their output,
// and (as PID 1) reaps orphans. Only cmd/space-agent and tests import it; it imports agentpb and
// errdefs, never the host-side client package agent.
package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"

	"github.com/space-sandbox/space/internal/agentpb/filesystem/filesystemconnect"
	"github.com/space-sandbox/space/internal/agentpb/process/processconnect"
)

// Defaults of Config fields left zero.
const (
	DefaultPasswdPath       = "/etc/passwd"
	DefaultGroupPath        = "/etc/group"
	DefaultUser             = "root"
	DefaultOutputRetention  = 8 << 20
	DefaultFinishedBudget   = 64 << 20
	DefaultProcessTTL       = 10 * time.Minute
	DefaultMaxProcesses     = 1000
	DefaultKeepalive        = 90 * time.Second
	DefaultPath             = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	keepaliveHeader         = "Keepalive-Ping-Interval"
	accessTokenHeader       = "X-Access-Token"
	defaultDrainGrace       = 200 * time.Millisecond
	defaultWatcherQueueSize = 10000
)

// Config is everything the server needs; cmd/space-agent fills it from flags and environment.
// Paths of the user database are injectable so tests run unprivileged without a chroot; file
// operations always use the real paths they are given.
type Config struct {
	// Token, if non-empty, must be presented in X-Access-Token on every request but GET /health.
	Token string
	// PasswdPath and GroupPath locate the user database (default /etc/passwd, /etc/group).
	PasswdPath, GroupPath string
	// DefaultUser runs commands and owns files when a request names no user (default "root").
	DefaultUser string
	// BaseEnv (KEY=VALUE) is the environment every command starts from, before the user's HOME,
	// USER, LOGNAME and the request's envs are laid over it. It must not hold agent secrets.
	BaseEnv []string
	// ReapAll makes the reaper collect every child (the agent is PID 1 or a subreaper); otherwise
	// it waits only for the processes it started, leaving other children of the process alone.
	ReapAll bool
	// OutputRetention is how many bytes of the most recent output are kept per process for late
	// readers (default 8 MiB). It also bounds how far a process may run ahead of a slow Start
	// stream before its writes block.
	OutputRetention int
	// FinishedOutputBudget bounds the output retained over all finished processes (default
	// 64 MiB); beyond it the oldest finished processes lose their output (not their status).
	FinishedOutputBudget int
	// ProcessTTL and MaxProcesses bound how long and how many finished processes are remembered
	// (defaults 10 minutes, 1000).
	ProcessTTL   time.Duration
	MaxProcesses int
	// Keepalive is the idle interval of stream keepalives when the client does not send the
	// Keepalive-Ping-Interval header (default 90 s).
	Keepalive time.Duration
	// DrainGrace is how long output is still read after a process exited while some other
	// process (a background grandchild) holds its output open (default 200 ms, rolling).
	DrainGrace time.Duration
	// Logger receives the server's logs; nil discards them.
	Logger *slog.Logger
}

func (c *Config) setDefaults() {
	if c.PasswdPath == "" {
		c.PasswdPath = DefaultPasswdPath
	}
	if c.GroupPath == "" {
		c.GroupPath = DefaultGroupPath
	}
	if c.DefaultUser == "" {
		c.DefaultUser = DefaultUser
	}
	if c.OutputRetention <= 0 {
		c.OutputRetention = DefaultOutputRetention
	}
	if c.FinishedOutputBudget <= 0 {
		c.FinishedOutputBudget = DefaultFinishedBudget
	}
	if c.ProcessTTL <= 0 {
		c.ProcessTTL = DefaultProcessTTL
	}
	if c.MaxProcesses <= 0 {
		c.MaxProcesses = DefaultMaxProcesses
	}
	if c.Keepalive <= 0 {
		c.Keepalive = DefaultKeepalive
	}
	if c.DrainGrace <= 0 {
		c.DrainGrace = defaultDrainGrace
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Server is one agent. Create it with New, serve it with Serve (or mount Handler), and Close it.
// Closing stops the reaper and the watchers; it leaves running processes alone.
type Server struct {
	cfg     Config
	log     *slog.Logger
	users   *userDB
	procs   *procTable
	reaper  *reaper
	watches *watcherSet
	handler http.Handler
	// initEnv holds variables POST /init set, laid over cfg.BaseEnv for every later command.
	initEnv atomic.Pointer[[]string]
}

// New builds a server and starts its reaper.
func New(cfg Config) (*Server, error) {
	cfg.setDefaults()
	s := &Server{
		cfg:     cfg,
		log:     cfg.Logger,
		users:   newUserDB(cfg.PasswdPath, cfg.GroupPath),
		watches: newWatcherSet(),
	}
	s.procs = newProcTable(&s.cfg)
	s.reaper = startReaper(s.procs, cfg.ReapAll, s.log)

	token := newAccessToken(cfg.Token)
	auth := &authInterceptor{token: token, users: s.users, defaultUser: cfg.DefaultUser}
	opts := []connect.HandlerOption{connect.WithInterceptors(auth)}
	mux := http.NewServeMux()
	mux.Handle(processconnect.NewProcessHandler(&processService{s: s}, opts...))
	mux.Handle(filesystemconnect.NewFilesystemHandler(&filesystemService{s: s}, opts...))
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	})
	mux.Handle("/files", requireToken(token, &filesHandler{s: s}))
	mux.Handle("GET /envs", requireToken(token, http.HandlerFunc(s.serveEnvs)))
	mux.Handle("POST /init", initHandler(token, func(env []string) { s.initEnv.Store(&env) }))
	mux.Handle("POST /restore", requireToken(token, &restoreHandler{s: s}))
	s.handler = mux
	return s, nil
}

// Handler returns the server's HTTP handler (RPC, /files, /health).
func (s *Server) Handler() http.Handler { return s.handler }

// Serve serves HTTP/1.1 and h2c on ln until ctx is done, then shuts down: it stops accepting,
// gives open requests a second to finish and closes the rest. Processes keep running.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	var protos http.Protocols
	protos.SetHTTP1(true)
	protos.SetUnencryptedHTTP2(true)
	hs := &http.Server{
		Handler:           s.handler,
		Protocols:         &protos,
		ReadHeaderTimeout: 30 * time.Second,
		IdleTimeout:       5 * time.Minute,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil {
		_ = hs.Close()
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve: %w", err)
	}
	return nil
}

// Close stops the reaper and every watcher. It does not kill processes.
func (s *Server) Close() error {
	s.reaper.stop()
	s.watches.closeAll()
	return nil
}

// SignalAll sends sig to the process group of every running process (used on agent shutdown).
func (s *Server) SignalAll(sig os.Signal) {
	s.procs.signalAll(sig)
}

// baseEnv is the environment every command starts from: the configured base, then what POST
// /init set.
func (s *Server) baseEnv() []string {
	extra := s.initEnv.Load()
	if extra == nil {
		return s.cfg.BaseEnv
	}
	return append(slices.Clone(s.cfg.BaseEnv), *extra...)
}

// perProcessEnv reports the variables each command gets for its own user and shell, left out
// of /envs.
func perProcessEnv(k string) bool {
	switch k {
	case "HOME", "USER", "LOGNAME", "SHELL", "PWD", "OLDPWD", "SHLVL", "_":
		return true
	}
	return false
}

// serveEnvs answers GET /envs (envd's): the variables every command starts with, as an object.
// The code interpreter's server reads them for kernels it started before the sandbox got them
// (a warm sandbox).
func (s *Server) serveEnvs(w http.ResponseWriter, _ *http.Request) {
	out := map[string]string{}
	for _, kv := range s.baseEnv() {
		k, v, _ := strings.Cut(kv, "=")
		if k != "" && !perProcessEnv(k) {
			out[k] = v
		}
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(out)
}
