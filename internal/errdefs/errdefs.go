// Package errdefs defines the few error classes SPACE uses across packages. Lower layers wrap one
// of these sentinels with %w; the API layer maps them to HTTP status codes in exactly one place.
// Any package may import it; it imports nothing of SPACE.
package errdefs

import "errors"

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
