package e2b

import (
	"context"
	"crypto/subtle"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"

	codeserver "github.com/space-sandbox/space/internal/codeinterp/server"
	"github.com/space-sandbox/space/internal/errdefs"
	"github.com/space-sandbox/space/internal/sandbox"
)

// envdPort is the port the SDK addresses envd on.
const envdPort = 49983

// envd forwards a request for sandbox id's envd to its agent, which speaks envd's protocol:
// Connect RPCs (streams stay streams: every write is flushed), /files, /health. The caller must
// hold the sandbox's access token (X-Access-Token); the agent checks it again. A paused sandbox
// is resumed. /health of a sandbox that is not there or not running answers 502, which the SDK
// reads as "not running".
func (h *Handler) envd(w http.ResponseWriter, r *http.Request, id string) {
	base, rt, life, err := h.sb.Envd(id, r.Header.Get("X-Access-Token"))
	if err != nil {
		if r.URL.Path == "/health" {
			writeJSON(w, http.StatusBadGateway, map[string]any{"code": http.StatusBadGateway, "message": "sandbox is not running"})
			return
		}
		h.writeError(w, err)
		return
	}
	// E2B runs commands and file calls that name no user as "user" in /home/user (its
	// templates do); the agent does so where the sandbox has that user.
	r.Header.Set("X-Space-Default-User", "user")
	Forward(w, r, base, rt, life, h.log, "E2b-Sandbox-Id", "E2b-Sandbox-Port")
}

// port forwards a request for <port>-<id>.<domain> (or, with E2B_SANDBOX_URL, one naming the
// port in E2b-Sandbox-Port) to that port of the sandbox. A sandbox with a traffic token demands
// it in the e2b-traffic-access-token header, and running code in the code interpreter
// (POST /execute on its port) demands the sandbox's access token in X-Access-Token, which the
// SDK sends there; both are checked before the sandbox is touched (a paused one is resumed only
// for a caller holding them).
func (h *Handler) port(w http.ResponseWriter, r *http.Request, id string, port int) {
	presented := r.Header.Get("e2b-traffic-access-token")
	execute := port == codeserver.Port && r.URL.Path == "/execute"
	t, err := h.sb.Port("", id, port, func(s sandbox.PortSecrets) error {
		if s.TrafficToken != "" && subtle.ConstantTimeCompare([]byte(presented), []byte(s.TrafficToken)) != 1 {
			return errdefs.New(errdefs.ErrPermissionDenied, "this sandbox's ports need its traffic access token (e2b-traffic-access-token)")
		}
		if execute && subtle.ConstantTimeCompare([]byte(r.Header.Get("X-Access-Token")), []byte(s.AccessToken)) != 1 {
			return errdefs.New(errdefs.ErrUnauthenticated, "running code needs the sandbox's access token (X-Access-Token)")
		}
		return nil
	})
	if err != nil {
		h.writeError(w, err)
		return
	}
	Forward(w, r, t.URL, t.Transport, t.Life, h.log, "e2b-traffic-access-token", "E2b-Sandbox-Id", "E2b-Sandbox-Port")
}

// hostTarget parses a host name <port>-<id>.<domain>.
func (h *Handler) hostTarget(r *http.Request) (id string, port int) {
	if h.cfg.Domain == "" {
		return "", 0
	}
	host := r.Host
	if i := strings.LastIndexByte(host, ':'); i >= 0 {
		host = host[:i]
	}
	rest, ok := strings.CutSuffix(host, "."+h.cfg.Domain)
	if !ok {
		return "", 0
	}
	p, id, ok := strings.Cut(rest, "-")
	if !ok {
		return "", 0
	}
	n, err := strconv.Atoi(p)
	if err != nil || n < 1 || n > 65535 {
		return "", 0
	}
	return id, n
}

// Forward proxies r to base (an agent or a port of a sandbox), streaming both ways, ending when
// the sandbox's life does; drop lists request headers not to pass on.
func Forward(w http.ResponseWriter, r *http.Request, base string, rt http.RoundTripper, life context.Context, log *slog.Logger, drop ...string) {
	target, err := url.Parse(base)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	// The agent may answer (and spaced flush its headers) before it has read the whole request
	// body; without full duplex, Go's HTTP/1.1 server then fails further body reads, the copy to
	// the agent breaks and the transport drops the connection mid-stream.
	if err := http.NewResponseController(w).EnableFullDuplex(); err != nil {
		log.Debug("full duplex unavailable", "err", err)
	}
	ctx, cancel := context.WithCancelCause(r.Context())
	defer cancel(nil)
	stop := context.AfterFunc(life, func() { cancel(context.Cause(life)) })
	defer stop()
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.Host = target.Host
			for _, hd := range drop {
				pr.Out.Header.Del(hd)
			}
		},
		Transport:     rt,
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if errors.Is(err, context.Canceled) && r.Context().Err() != nil {
				return // the client went away
			}
			log.Warn("sandbox proxy", "target", base, "path", r.URL.Path, "err", err)
			writeJSON(w, http.StatusBadGateway, map[string]any{"code": http.StatusBadGateway, "message": "sandbox did not answer: " + err.Error()})
		},
	}
	proxy.ServeHTTP(w, r.WithContext(ctx))
}
