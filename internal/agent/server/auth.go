package server

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"

	"connectrpc.com/connect"

	"github.com/space-sandbox/space/internal/errdefs"
)

// tokenOK reports whether got equals want, in time independent of both (hashing first hides
// the length too). An empty want accepts anything.
func tokenOK(want, got string) bool {
	if want == "" {
		return true
	}
	a, b := sha256.Sum256([]byte(want)), sha256.Sum256([]byte(got))
	return subtle.ConstantTimeCompare(a[:], b[:]) == 1
}

// basicAuthUser extracts the user name from "Authorization: Basic base64(user:password)". ok is
// false if the header is absent or uses another scheme; err is set if it is Basic but malformed.
func basicAuthUser(header string) (user string, ok bool, err error) {
	scheme, rest, found := strings.Cut(strings.TrimSpace(header), " ")
	if !found || !strings.EqualFold(scheme, "Basic") {
		return "", false, nil
	}
	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(rest))
	if err != nil {
		return "", true, errdefs.InvalidArgument("malformed basic authorization header")
	}
	user, _, _ = strings.Cut(string(raw), ":")
	if user == "" {
		return "", true, errdefs.InvalidArgument("basic authorization names no user")
	}
	return user, true, nil
}

type userKey struct{}

func withUser(ctx context.Context, u User) context.Context {
	return context.WithValue(ctx, userKey{}, u)
}

// userFrom returns the user the auth interceptor attached to ctx.
func userFrom(ctx context.Context) User {
	u, _ := ctx.Value(userKey{}).(User)
	return u
}

// accessToken is the agent's current token; POST /init replaces it (a restored copy of a sandbox
// gets its own).
type accessToken struct{ v atomic.Pointer[string] }

func newAccessToken(t string) *accessToken {
	a := &accessToken{}
	a.v.Store(&t)
	return a
}

func (a *accessToken) get() string  { return *a.v.Load() }
func (a *accessToken) set(t string) { a.v.Store(&t) }

// defaultUserHeader names the user a request that names none runs as, if the sandbox has that
// user (spaced's E2B routes ask for E2B's "user"); otherwise the agent's default applies.
const defaultUserHeader = "X-Space-Default-User"

// preferredDefault is the user a request naming none runs as.
func preferredDefault(users *userDB, h http.Header, fallback string) string {
	if n := h.Get(defaultUserHeader); n != "" {
		if _, err := users.lookup(n); err == nil {
			return n
		}
	}
	return fallback
}

// authInterceptor checks the access token of every RPC and resolves the calling user.
type authInterceptor struct {
	token       *accessToken
	users       *userDB
	defaultUser string
}

func (a *authInterceptor) authenticate(ctx context.Context, h http.Header) (context.Context, error) {
	if !tokenOK(a.token.get(), h.Get(accessTokenHeader)) {
		return ctx, connect.NewError(connect.CodeUnauthenticated, errors.New("invalid or missing access token"))
	}
	name := preferredDefault(a.users, h, a.defaultUser)
	if n, ok, err := basicAuthUser(h.Get("Authorization")); err != nil {
		return ctx, connectErr(err)
	} else if ok {
		name = n
	}
	u, err := a.users.lookup(name)
	if err != nil {
		return ctx, connectErr(err)
	}
	return withUser(ctx, u), nil
}

func (a *authInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		ctx, err := a.authenticate(ctx, req.Header())
		if err != nil {
			return nil, err
		}
		return next(ctx, req)
	}
}

func (a *authInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (a *authInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		ctx, err := a.authenticate(ctx, conn.RequestHeader())
		if err != nil {
			return err
		}
		return next(ctx, conn)
	}
}

// requireToken guards plain HTTP routes with the access token.
func requireToken(token *accessToken, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !tokenOK(token.get(), r.Header.Get(accessTokenHeader)) {
			writeJSONError(w, http.StatusUnauthorized, "invalid or missing access token")
			return
		}
		next.ServeHTTP(w, r)
	})
}

// connectErr maps an errdefs class to its Connect code, keeping the message.
func connectErr(err error) error {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce
	}
	code := connect.CodeInternal
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		code = connect.CodeNotFound
	case errors.Is(err, errdefs.ErrInvalidArgument):
		code = connect.CodeInvalidArgument
	case errors.Is(err, errdefs.ErrAlreadyExists):
		code = connect.CodeAlreadyExists
	case errors.Is(err, errdefs.ErrFailedPrecondition):
		code = connect.CodeFailedPrecondition
	case errors.Is(err, errdefs.ErrPermissionDenied):
		code = connect.CodePermissionDenied
	case errors.Is(err, errdefs.ErrResourceExhausted):
		code = connect.CodeResourceExhausted
	case errors.Is(err, errdefs.ErrUnavailable):
		code = connect.CodeUnavailable
	case errors.Is(err, errdefs.ErrUnauthenticated):
		code = connect.CodeUnauthenticated
	case errors.Is(err, context.DeadlineExceeded):
		code = connect.CodeDeadlineExceeded
	case errors.Is(err, context.Canceled):
		code = connect.CodeCanceled
	}
	return connect.NewError(code, err)
}

// initHandler serves POST /init {"accessToken": "…", "envVars": {…}} (as E2B's envd /init
// does): the caller, holding the current token, gives the agent a new token, or environment
// variables every later command starts with (over the base environment), or both. A request
// with neither, or a variable name that is empty or holds '=' or NUL, is refused.
func initHandler(token *accessToken, setEnv func([]string)) http.Handler {
	return requireToken(token, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			AccessToken string            `json:"accessToken"`
			EnvVars     map[string]string `json:"envVars"`
		}
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 256<<10)).Decode(&req); err != nil || (req.AccessToken == "" && req.EnvVars == nil) {
			writeJSONError(w, http.StatusBadRequest, "want {\"accessToken\": \"…\"} and/or {\"envVars\": {…}}")
			return
		}
		env := make([]string, 0, len(req.EnvVars))
		for _, k := range slices.Sorted(maps.Keys(req.EnvVars)) {
			v := req.EnvVars[k]
			if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
				writeJSONError(w, http.StatusBadRequest, fmt.Sprintf("envVars: bad variable %q", k))
				return
			}
			env = append(env, k+"="+v)
		}
		if req.EnvVars != nil {
			setEnv(env)
		}
		if req.AccessToken != "" {
			token.set(req.AccessToken)
		}
		w.WriteHeader(http.StatusNoContent)
	}))
}
