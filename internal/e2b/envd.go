package e2b

import (
	"context"
	"errors"
	"net/http"
	"net/http/httputil"
	"net/url"
)

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
	target, err := url.Parse(base)
	if err != nil {
		h.writeError(w, err)
		return
	}
	// The request ends when the sandbox stops, as every stream to an agent does.
	ctx, cancel := context.WithCancelCause(r.Context())
	defer cancel(nil)
	stop := context.AfterFunc(life, func() { cancel(context.Cause(life)) })
	defer stop()
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.Host = target.Host
			pr.Out.Header.Del("E2b-Sandbox-Id")
			pr.Out.Header.Del("E2b-Sandbox-Port")
		},
		Transport:     rt,
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if errors.Is(err, context.Canceled) && r.Context().Err() != nil {
				return // the client went away
			}
			h.log.Warn("envd proxy", "sandbox", id, "path", r.URL.Path, "err", err)
			writeJSON(w, http.StatusBadGateway, map[string]any{"code": http.StatusBadGateway, "message": "sandbox did not answer: " + err.Error()})
		},
	}
	proxy.ServeHTTP(w, r.WithContext(ctx))
}
