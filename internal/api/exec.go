package api

import (
	"bufio"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/space-sandbox/space/internal/agent"
	"github.com/space-sandbox/space/internal/auth"
	"github.com/space-sandbox/space/internal/errdefs"
	"github.com/space-sandbox/space/internal/sandbox"
)

type execRequest struct {
	Cmd            []string          `json:"cmd"`
	Command        *string           `json:"command"`
	Env            map[string]string `json:"env"`
	Cwd            string            `json:"cwd"`
	User           string            `json:"user"`
	Stdin          *string           `json:"stdin"`
	TimeoutSeconds *float64          `json:"timeout_seconds"`
	Background     bool              `json:"background"`
	PTY            *struct {
		Cols uint16 `json:"cols"`
		Rows uint16 `json:"rows"`
	} `json:"pty"`
}

func (req execRequest) options() (sandbox.ExecOptions, error) {
	var o sandbox.ExecOptions
	switch {
	case len(req.Cmd) > 0 && req.Command != nil:
		return o, errdefs.InvalidArgument("give exactly one of cmd and command, not both")
	case len(req.Cmd) > 0:
		o.Argv = req.Cmd
	case req.Command != nil && *req.Command != "":
		o.Argv = []string{"/bin/sh", "-c", *req.Command}
	default:
		return o, errdefs.InvalidArgument("give exactly one of cmd (argv) and command (a shell string)")
	}
	if o.Argv[0] == "" {
		return o, errdefs.InvalidArgument("cmd: the program name is empty")
	}
	for _, a := range o.Argv {
		if strings.ContainsRune(a, 0) {
			return o, errdefs.InvalidArgument("cmd: arguments must not contain NUL")
		}
	}
	if req.Cwd != "" {
		cwd, err := cleanPath("cwd", req.Cwd)
		if err != nil {
			return o, err
		}
		o.Cwd = cwd
	}
	if req.User != "" && (len(req.User) > 32 || strings.ContainsAny(req.User, ":/\x00 ")) {
		return o, errdefs.InvalidArgument(fmt.Sprintf("user %q: not a user name", req.User))
	}
	if req.TimeoutSeconds != nil {
		if *req.TimeoutSeconds <= 0 || *req.TimeoutSeconds > 86400 {
			return o, errdefs.InvalidArgument("timeout_seconds: want more than 0 and at most 86400")
		}
		o.Timeout = time.Duration(*req.TimeoutSeconds * float64(time.Second))
	}
	if req.PTY != nil {
		if req.PTY.Cols == 0 || req.PTY.Rows == 0 {
			return o, errdefs.InvalidArgument("pty: cols and rows must be positive")
		}
		o.PTY = &agent.PTYSize{Cols: req.PTY.Cols, Rows: req.PTY.Rows}
	}
	o.Env, o.User, o.Stdin, o.Background = req.Env, req.User, req.Stdin, req.Background
	return o, nil
}

func (s *Server) handleExec(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	var req execRequest
	if err := decodeJSON(w, r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	opts, err := req.options()
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	ex, err := s.sb.Exec(r.Context(), p.Tenant, r.PathValue("id"), opts)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer ex.Close()
	s.metrics.execs.Add(1)
	if opts.Background {
		writeJSON(w, http.StatusAccepted, map[string]uint32{"pid": ex.PID()})
		return
	}
	if wantsSSE(r) {
		s.streamExec(w, ex, true)
		return
	}
	s.collectExec(w, r, ex)
}

// streamExec writes an execution as SSE: start, stdout/stderr, exit (or error).
func (s *Server) streamExec(w http.ResponseWriter, ex *sandbox.Execution, withStart bool) {
	sse := startSSE(w, http.StatusOK)
	defer sse.close()
	if withStart {
		if sse.send("start", map[string]uint32{"pid": ex.PID()}) != nil {
			return
		}
	}
	var out, errs utf8Splitter
	for {
		ev, err := ex.Next()
		if err == io.EOF {
			return
		}
		if err != nil {
			status, code := statusOf(err)
			_ = sse.send("error", errorDetail{Code: code, Message: messageOf(err, status)})
			return
		}
		var werr error
		switch ev.Kind {
		case sandbox.ExecStdout:
			werr = sendData(sse, "stdout", out.next(ev.Data))
		case sandbox.ExecStderr:
			werr = sendData(sse, "stderr", errs.next(ev.Data))
		case sandbox.ExecExit:
			if werr = sendData(sse, "stdout", out.flush()); werr == nil {
				werr = sendData(sse, "stderr", errs.flush())
			}
			if werr == nil {
				werr = sse.send("exit", map[string]int64{"exit_code": int64(ev.ExitCode), "duration_ms": ev.Duration.Milliseconds()})
			}
		}
		if werr != nil {
			return // the client went away; the command carries on (see Execution.Close)
		}
	}
}

// sendData sends one stdout/stderr event: text when the bytes are UTF-8, else base64.
func sendData(sse *sseStream, event string, b []byte) error {
	if len(b) == 0 {
		return nil
	}
	if utf8.Valid(b) {
		return sse.send(event, map[string]string{"data": string(b)})
	}
	return sse.send(event, map[string]string{"data_b64": base64.StdEncoding.EncodeToString(b)})
}

// utf8Splitter holds back an incomplete UTF-8 sequence at the end of a chunk so that a character
// split across two reads is not sent as base64.
type utf8Splitter struct{ pending []byte }

func (u *utf8Splitter) next(b []byte) []byte {
	buf := append(u.pending, b...)
	u.pending = nil
	// Look at most 3 bytes back for the start of an incomplete rune.
	for i := 1; i <= 3 && i <= len(buf); i++ {
		c := buf[len(buf)-i]
		if c < 0x80 {
			break // ASCII: complete
		}
		if c >= 0xC0 { // a lead byte
			if !utf8.FullRune(buf[len(buf)-i:]) {
				u.pending = append([]byte(nil), buf[len(buf)-i:]...)
				buf = buf[:len(buf)-i]
			}
			break
		}
	}
	return buf
}

func (u *utf8Splitter) flush() []byte {
	b := u.pending
	u.pending = nil
	return b
}

// collectExec runs an execution to its end and answers with one JSON object. Output is spooled
// to anonymous files of s.spool, never held in memory, and streamed into the response; past
// the spool's per-stream share or its budget the rest is dropped and the answer says
// "truncated": true (use SSE for more). The command runs on either way.
func (s *Server) collectExec(w http.ResponseWriter, r *http.Request, ex *sandbox.Execution) {
	stdout, err := s.spool.create()
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer stdout.Close()
	stderr, err := s.spool.create()
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer stderr.Close()
	var exit sandbox.ExecEvent
	var spooled [2]int64 // stdout, stderr: bytes written, all reserved from the spool
	defer func() { s.spool.release(spooled[0] + spooled[1]) }()
	truncated := false
	for {
		ev, err := ex.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		switch ev.Kind {
		case sandbox.ExecStdout, sandbox.ExecStderr:
			i, f := 0, stdout
			if ev.Kind == sandbox.ExecStderr {
				i, f = 1, stderr
			}
			data := ev.Data
			if room := s.spool.perOut - spooled[i]; int64(len(data)) > room {
				data, truncated = data[:max(room, 0)], true
			}
			if got := s.spool.reserve(int64(len(data))); got < int64(len(data)) {
				data, truncated = data[:got], true
			}
			spooled[i] += int64(len(data))
			if len(data) > 0 {
				_, err = f.Write(data)
			}
		case sandbox.ExecExit:
			exit = ev
		}
		if err != nil {
			s.writeError(w, r, fmt.Errorf("spool output: %w", err))
			return
		}
		if ev.Kind == sandbox.ExecExit {
			break
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	bw := bufio.NewWriterSize(w, 64<<10)
	fmt.Fprintf(bw, `{"pid":%d,"exit_code":%d,"duration_ms":%d,"stdout":`, ex.PID(), exit.ExitCode, exit.Duration.Milliseconds())
	if err := writeJSONStringFrom(bw, stdout); err != nil {
		s.log.Debug("write exec response", "err", err)
		return
	}
	bw.WriteString(`,"stderr":`)
	if err := writeJSONStringFrom(bw, stderr); err != nil {
		s.log.Debug("write exec response", "err", err)
		return
	}
	if truncated {
		bw.WriteString(`,"truncated":true`)
	}
	bw.WriteString("}\n")
	_ = bw.Flush()
}

// writeJSONStringFrom writes the contents of f, from its start, as one JSON string. Invalid UTF-8
// becomes U+FFFD, as encoding/json does.
func writeJSONStringFrom(w *bufio.Writer, f *os.File) error {
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	br := bufio.NewReaderSize(f, 64<<10)
	w.WriteByte('"')
	const hex = "0123456789abcdef"
	for {
		c, size, err := br.ReadRune()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		switch {
		case c == utf8.RuneError && size == 1:
			w.WriteString(`\ufffd`)
		case c == '"':
			w.WriteString(`\"`)
		case c == '\\':
			w.WriteString(`\\`)
		case c == '\n':
			w.WriteString(`\n`)
		case c == '\r':
			w.WriteString(`\r`)
		case c == '\t':
			w.WriteString(`\t`)
		case c < 0x20 || c == '<' || c == '>' || c == '&' || c == '\u2028' || c == '\u2029':
			w.WriteString(`\u`)
			w.WriteByte(hex[c>>12&0xf])
			w.WriteByte(hex[c>>8&0xf])
			w.WriteByte(hex[c>>4&0xf])
			w.WriteByte(hex[c&0xf])
		default:
			w.WriteRune(c)
		}
	}
	w.WriteByte('"')
	return w.Flush()
}

type processJSON struct {
	PID       uint32    `json:"pid"`
	Cmd       []string  `json:"cmd"`
	Running   bool      `json:"running"`
	ExitCode  *int      `json:"exit_code"`
	StartedAt time.Time `json:"started_at"`
	Tag       string    `json:"tag,omitempty"`
}

func (s *Server) handleProcesses(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	list, err := s.sb.Processes(r.Context(), p.Tenant, r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := make([]processJSON, 0, len(list))
	for _, pi := range list {
		out = append(out, processJSON{PID: pi.PID, Cmd: pi.Argv, Running: pi.Running, ExitCode: pi.ExitCode, StartedAt: pi.StartedAt.UTC(), Tag: pi.Tag})
	}
	writeJSON(w, http.StatusOK, map[string]any{"processes": out})
}

func (s *Server) handleProcessEvents(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	pid, err := pathPID(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	ex, err := s.sb.Attach(r.Context(), p.Tenant, r.PathValue("id"), pid)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer ex.Close()
	s.streamExec(w, ex, true)
}

func (s *Server) handleStdin(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	pid, err := pathPID(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	eof := false
	if v := r.URL.Query().Get("eof"); v != "" {
		if eof, err = strconv.ParseBool(v); err != nil {
			s.writeError(w, r, errdefs.InvalidArgument("eof: want true or false"))
			return
		}
	}
	body := http.MaxBytesReader(w, r.Body, 64<<20)
	if err := s.sb.Stdin(r.Context(), p.Tenant, r.PathValue("id"), pid, body, eof); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// signals are the signal names the API accepts (with or without the SIG prefix).
var signals = map[string]syscall.Signal{
	"HUP": syscall.SIGHUP, "INT": syscall.SIGINT, "QUIT": syscall.SIGQUIT, "KILL": syscall.SIGKILL,
	"USR1": syscall.SIGUSR1, "USR2": syscall.SIGUSR2, "TERM": syscall.SIGTERM, "CONT": syscall.SIGCONT,
	"STOP": syscall.SIGSTOP, "TSTP": syscall.SIGTSTP, "WINCH": syscall.SIGWINCH, "ALRM": syscall.SIGALRM,
}

func parseSignal(name string) (syscall.Signal, error) {
	if sig, ok := signals[strings.TrimPrefix(strings.ToUpper(name), "SIG")]; ok {
		return sig, nil
	}
	return 0, errdefs.InvalidArgument(fmt.Sprintf("signal %q: want a name such as SIGTERM or SIGKILL", name))
}

func (s *Server) handleSignal(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	pid, err := pathPID(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	var req struct {
		Signal string `json:"signal"`
	}
	if err := decodeJSON(w, r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	sig, err := parseSignal(req.Signal)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if err := s.sb.Signal(r.Context(), p.Tenant, r.PathValue("id"), pid, sig); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) handleResize(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	pid, err := pathPID(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	var req struct {
		Cols uint16 `json:"cols"`
		Rows uint16 `json:"rows"`
	}
	if err := decodeJSON(w, r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	if err := s.sb.Resize(r.Context(), p.Tenant, r.PathValue("id"), pid, agent.PTYSize{Cols: req.Cols, Rows: req.Rows}); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
