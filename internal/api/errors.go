package api

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"

	"github.com/space-sandbox/space/internal/errdefs"
)

type errorBody struct {
	Error errorDetail `json:"error"`
}

type errorDetail struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// statusOf is the one place where error classes become HTTP statuses and API error codes.
func statusOf(err error) (int, string) {
	switch {
	case errors.Is(errdefs.NoSpace(err), errdefs.ErrInsufficientStorage):
		return http.StatusInsufficientStorage, "insufficient_storage"
	case errors.Is(err, errdefs.ErrInvalidArgument):
		return http.StatusBadRequest, "invalid_argument"
	case errors.Is(err, errdefs.ErrUnauthenticated):
		return http.StatusUnauthorized, "unauthenticated"
	case errors.Is(err, errdefs.ErrPermissionDenied):
		return http.StatusForbidden, "permission_denied"
	case errors.Is(err, errdefs.ErrNotFound):
		return http.StatusNotFound, "not_found"
	case errors.Is(err, errdefs.ErrAlreadyExists), errors.Is(err, errdefs.ErrFailedPrecondition):
		return http.StatusConflict, "conflict"
	case errors.Is(err, errdefs.ErrTooLarge):
		return http.StatusRequestEntityTooLarge, "too_large"
	case errors.Is(err, errdefs.ErrResourceExhausted):
		return http.StatusTooManyRequests, "resource_exhausted"
	case errors.Is(err, errdefs.ErrUnavailable):
		return http.StatusServiceUnavailable, "unavailable"
	case errors.Is(err, errdefs.ErrUpstream):
		return http.StatusBadGateway, "bad_gateway"
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return http.StatusServiceUnavailable, "unavailable"
	}
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return http.StatusRequestEntityTooLarge, "too_large"
	}
	return http.StatusInternalServerError, "internal"
}

// messageOf is the client-facing message: the errdefs message if there is one, else the error
// text for 4xx and a generic sentence for 5xx (details go to the log).
func messageOf(err error, status int) string {
	var e *errdefs.Error
	if errors.As(errdefs.NoSpace(err), &e) {
		return e.Message
	}
	if status >= 500 && status != http.StatusServiceUnavailable && status != http.StatusBadGateway {
		return "internal error; see the server log"
	}
	return err.Error()
}

func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	status, code := statusOf(err)
	if r.Context().Err() != nil && !errors.Is(err, errBodyTimeout) {
		return // the client is gone; there is no one to answer
	}
	if status >= 500 {
		s.log.Error("request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	} else {
		s.log.Debug("request rejected", "method", r.Method, "path", r.URL.Path, "status", status, "err", err)
	}
	writeJSON(w, status, errorBody{Error: errorDetail{Code: code, Message: messageOf(err, status)}})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	if v == nil {
		return
	}
	if err := json.NewEncoder(w).Encode(v); err != nil {
		slog.Debug("write response", "err", err)
	}
}
