package fake

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"time"
)

// serve serves h on ln as the agent's own Serve does (HTTP/1.1 and h2c) until ctx is done, then
// gives open requests a second.
func serve(ctx context.Context, h http.Handler, ln net.Listener) {
	var protos http.Protocols
	protos.SetHTTP1(true)
	protos.SetUnencryptedHTTP2(true)
	hs := &http.Server{Handler: h, Protocols: &protos, ReadHeaderTimeout: 30 * time.Second,
		ErrorLog: log.New(io.Discard, "", 0)}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	select {
	case <-errc:
		return
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil {
		_ = hs.Close()
	}
	<-errc
}

// maxInitBody is what the agent reads of a POST /init.
const maxInitBody = 256 << 10

// tokenWatch passes every request to h and notes the token the agent takes over POST /init
// (answered 204): the token is part of the agent's memory, which a checkpoint keeps. It is noted
// as the answer is begun, before the answer can leave (a pause may hold it).
func (i *instance) tokenWatch(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/init" {
			h.ServeHTTP(w, r)
			return
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, maxInitBody+1))
		if err != nil && !errors.Is(err, io.EOF) {
			http.Error(w, "read body: "+err.Error(), http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		var req struct {
			AccessToken string `json:"accessToken"`
		}
		if json.Unmarshal(body, &req) != nil || req.AccessToken == "" {
			h.ServeHTTP(w, r)
			return
		}
		h.ServeHTTP(&tokenWriter{ResponseWriter: w, inst: i, token: req.AccessToken}, r)
	})
}

// tokenWriter records token as the agent's once the agent answers 204 (it took it).
type tokenWriter struct {
	http.ResponseWriter
	inst  *instance
	token string
}

func (w *tokenWriter) WriteHeader(code int) {
	if code == http.StatusNoContent {
		w.inst.token.Store(&w.token)
	}
	w.ResponseWriter.WriteHeader(code)
}
