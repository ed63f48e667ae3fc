package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/space-sandbox/space/internal/auth"
	"github.com/space-sandbox/space/internal/codeinterp"
	"github.com/space-sandbox/space/internal/errdefs"
	"github.com/space-sandbox/space/internal/sandbox"
)

// Limits of one run-code request.
const (
	defaultCodeTimeout = 300 * time.Second
	maxCodeTimeout     = 24 * time.Hour
	// maxCodeOutput bounds what a JSON answer collects (a stream has no bound): spaced holds it
	// all, about three times over while it grows.
	maxCodeOutput = 16 << 20
	// maxEventText bounds the text of one stdout or stderr event of a stream.
	maxEventText = 1 << 20
)

type codeRequest struct {
	Code           string            `json:"code"`
	Language       string            `json:"language"`
	ContextID      string            `json:"context_id"`
	Env            map[string]string `json:"env"`
	TimeoutSeconds *float64          `json:"timeout_seconds"`
}

// codeResult is the JSON answer of a run: everything the cell produced.
type codeResult struct {
	Results         []codeinterp.Result   `json:"results"`
	Stdout          string                `json:"stdout"`
	Stderr          string                `json:"stderr"`
	Error           *codeinterp.ExecError `json:"error"`
	ExecutionCount  int                   `json:"execution_count"`
	KernelRestarted string                `json:"kernel_restarted,omitempty"`
}

func (req codeRequest) toRun() (codeinterp.Request, error) {
	out := codeinterp.Request{Code: req.Code, Language: strings.ToLower(strings.TrimSpace(req.Language)), ContextID: req.ContextID, Env: req.Env}
	if strings.TrimSpace(req.Code) == "" {
		return out, errdefs.InvalidArgument("code: empty")
	}
	if len(req.Code) > codeinterp.MaxCode {
		return out, errdefs.New(errdefs.ErrTooLarge, fmt.Sprintf("code: %d bytes; the limit is %d", len(req.Code), codeinterp.MaxCode))
	}
	if out.Language != "" && out.ContextID != "" {
		return out, errdefs.InvalidArgument("give language or context_id, not both: a context has its language")
	}
	if err := sandbox.ValidateEnv("env", req.Env); err != nil {
		return out, err
	}
	timeout := defaultCodeTimeout
	if req.TimeoutSeconds != nil {
		t := *req.TimeoutSeconds
		if t <= 0 || t > maxCodeTimeout.Seconds() {
			return out, errdefs.InvalidArgument(fmt.Sprintf("timeout_seconds: want more than 0, at most %d", int(maxCodeTimeout.Seconds())))
		}
		timeout = time.Duration(t * float64(time.Second))
	}
	out.Timeout = timeout.Seconds()
	return out, nil
}

// handleRunCode runs a cell in the sandbox's code interpreter: POST /v1/sandboxes/{id}/code.
// An exception in the code is part of the answer (error), not an HTTP error.
func (s *Server) handleRunCode(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	var req codeRequest
	if err := decodeJSONLimit(w, r, &req, codeinterp.MaxCode+maxJSONBody); err != nil {
		s.writeError(w, r, err)
		return
	}
	run, err := req.toRun()
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.withInterpreter(w, r, p, func(ctx context.Context, ci *codeinterp.Client) error {
		// The server interrupts the cell at its timeout; this is the net under it.
		ctx, cancel := context.WithTimeout(ctx, time.Duration(run.Timeout*float64(time.Second))+30*time.Second)
		defer cancel()
		if wantsSSE(r) {
			streamCode(ctx, w, r, ci, run)
			return nil
		}
		return collectCode(ctx, w, ci, run)
	})
}

// collectCode runs the cell and answers everything it produced as one JSON object.
func collectCode(ctx context.Context, w http.ResponseWriter, ci *codeinterp.Client, run codeinterp.Request) error {
	var res codeResult
	var stdout, stderr strings.Builder
	size := 0
	err := ci.Execute(ctx, run, func(ev codeinterp.Event) error {
		size += ev.Size
		switch ev.Kind {
		case "stdout":
			stdout.WriteString(ev.Text)
		case "stderr":
			stderr.WriteString(ev.Text)
		case "result":
			res.Results = append(res.Results, *ev.Result)
		case "error":
			res.Error = ev.Error
		case "kernel_restarted":
			res.KernelRestarted = ev.Text
		case "end":
			res.ExecutionCount = ev.ExecutionCount
		}
		if size > maxCodeOutput {
			return errdefs.New(errdefs.ErrTooLarge, fmt.Sprintf("the cell's output passed %d bytes: ask for a stream (Accept: text/event-stream)", maxCodeOutput))
		}
		return nil
	})
	if err != nil {
		return err
	}
	res.Stdout, res.Stderr = stdout.String(), stderr.String()
	if res.Results == nil {
		res.Results = []codeinterp.Result{}
	}
	writeJSON(w, http.StatusOK, res)
	return nil
}

// streamCode runs the cell and answers its events as they come. A stream answers at once; what
// breaks it later is told in its last event.
func streamCode(ctx context.Context, w http.ResponseWriter, r *http.Request, ci *codeinterp.Client, run codeinterp.Request) {
	st := startSSE(w, http.StatusOK)
	defer st.close()
	err := ci.Execute(ctx, run, func(ev codeinterp.Event) error {
		switch ev.Kind {
		case "stdout", "stderr":
			// A cell's one huge print arrives as one piece; it goes on in pieces a client's
			// event buffer takes.
			for _, part := range splitText(ev.Text, maxEventText) {
				if err := st.send(ev.Kind, map[string]string{"text": part}); err != nil {
					return err
				}
			}
			return nil
		case "result":
			return st.send("result", ev.Result)
		case "error":
			return st.send("error", ev.Error)
		case "kernel_restarted":
			return st.send("kernel_restarted", map[string]string{"reason": ev.Text})
		case "end":
			return st.send("end", map[string]int{"execution_count": ev.ExecutionCount})
		}
		return nil
	})
	if err != nil && r.Context().Err() == nil && !errors.Is(err, errStreamClosed) {
		status, code := statusOf(err)
		st.send("end", map[string]any{"error": errorDetail{Code: code, Message: messageOf(err, status)}})
	}
}

func (s *Server) handleListContexts(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	s.withInterpreter(w, r, p, func(ctx context.Context, ci *codeinterp.Client) error {
		list, err := ci.Contexts(ctx)
		if err != nil {
			return err
		}
		if list == nil {
			list = []codeinterp.Context{}
		}
		writeJSON(w, http.StatusOK, list)
		return nil
	})
}

func (s *Server) handleCreateContext(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	var req struct {
		Language string `json:"language"`
		Cwd      string `json:"cwd"`
	}
	if err := decodeOptionalJSON(w, r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	if req.Cwd != "" {
		cwd, err := cleanPath("cwd", req.Cwd)
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		req.Cwd = cwd
	}
	s.withInterpreter(w, r, p, func(ctx context.Context, ci *codeinterp.Client) error {
		c, err := ci.CreateContext(ctx, strings.ToLower(strings.TrimSpace(req.Language)), req.Cwd)
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusCreated, c)
		return nil
	})
}

func (s *Server) handleDeleteContext(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	s.withInterpreter(w, r, p, func(ctx context.Context, ci *codeinterp.Client) error {
		return noContent(w, ci.DeleteContext(ctx, r.PathValue("ctx")))
	})
}

func (s *Server) handleRestartContext(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	s.withInterpreter(w, r, p, func(ctx context.Context, ci *codeinterp.Client) error {
		return noContent(w, ci.RestartContext(ctx, r.PathValue("ctx")))
	})
}

// withInterpreter runs fn with the code interpreter of tenant p's sandbox (resuming a paused
// one) and a context that also ends with the sandbox; an error before fn or from it is
// answered as the API's errors are.
func (s *Server) withInterpreter(w http.ResponseWriter, r *http.Request, p auth.Principal, fn func(context.Context, *codeinterp.Client) error) {
	t, err := s.sb.Service(p.Tenant, r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	ctx, cancel := withLife(r.Context(), t.Life)
	defer cancel()
	if err := fn(ctx, &codeinterp.Client{URL: t.URL, Transport: t.Transport, AccessToken: t.AccessToken}); err != nil {
		s.writeError(w, r, err)
	}
}

// noContent answers 204 unless err is set, which it returns.
func noContent(w http.ResponseWriter, err error) error {
	if err == nil {
		w.WriteHeader(http.StatusNoContent)
	}
	return err
}

// withLife returns ctx, also cancelled (with the sandbox's cause) when life ends.
func withLife(ctx, life context.Context) (context.Context, context.CancelFunc) {
	cctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(life, func() { cancel(context.Cause(life)) })
	return cctx, func() { stop(); cancel(context.Canceled) }
}

// splitText cuts s into pieces of at most n bytes, never inside a UTF-8 sequence.
func splitText(s string, n int) []string {
	var out []string
	for len(s) > n {
		cut := n
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		if cut == 0 {
			cut = n
		}
		out = append(out, s[:cut])
		s = s[cut:]
	}
	return append(out, s)
}
