// Package errdefs defines the few error classes SPACE uses across packages. Lower layers wrap one
// of these sentinels with %w; the API layer maps them to HTTP status codes in exactly one place.
// Any package may import it; it imports nothing of SPACE.
package errdefs

import (
	"errors"
	"strings"
	"syscall"
)

// Sentinel error classes. Test with errors.Is.
var (
	ErrNotFound           = errors.New("not found")
	ErrAlreadyExists      = errors.New("already exists")
	ErrInvalidArgument    = errors.New("invalid argument")
	ErrFailedPrecondition = errors.New("failed precondition") // wrong state
	ErrUnavailable        = errors.New("unavailable")
	ErrResourceExhausted  = errors.New("resource exhausted")
	ErrPermissionDenied   = errors.New("permission denied")
	ErrUnauthenticated    = errors.New("unauthenticated")
	ErrTooLarge           = errors.New("too large")
	ErrUpstream           = errors.New("upstream failed") // a server SPACE depends on (a registry) failed
	// ErrInsufficientStorage: the server's disk (where it keeps sandbox state) is full.
	ErrInsufficientStorage = errors.New("insufficient storage")
)

// Error pairs a class with a message meant for the client.
type Error struct {
	Class   error
	Message string
}

func (e *Error) Error() string { return e.Message }
func (e *Error) Unwrap() error { return e.Class }

// New returns an error of class cls whose client-facing message is msg.
func New(cls error, msg string) error { return &Error{Class: cls, Message: msg} }

// NotFound, InvalidArgument, Conflict: shorthands for the common classes.
func NotFound(msg string) error        { return New(ErrNotFound, msg) }
func InvalidArgument(msg string) error { return New(ErrInvalidArgument, msg) }
func Conflict(msg string) error        { return New(ErrFailedPrecondition, msg) }

// NoSpace classifies err as ErrInsufficientStorage when it comes from a full disk: ENOSPC, also
// as a runtime reports it in the text of its error. The message says what happened without the
// host paths the original names. Other errors are returned as they are.
func NoSpace(err error) error {
	if err == nil || errors.Is(err, ErrInsufficientStorage) {
		return err
	}
	if errors.Is(err, syscall.ENOSPC) || strings.Contains(err.Error(), "no space left on device") {
		return &Error{Class: ErrInsufficientStorage, Message: "the server ran out of disk space where it keeps sandbox state; nothing was changed: free space and retry"}
	}
	return err
}
