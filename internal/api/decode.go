package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/space-sandbox/space/internal/errdefs"
	"github.com/space-sandbox/space/internal/jsondepth"
)

// maxJSONBody bounds JSON request bodies.
const maxJSONBody = 1 << 20

// maxJSONDepth bounds how deeply a JSON body may nest arrays and objects; a body that nests
// more is refused before it is decoded.
const maxJSONDepth = jsondepth.Max

// decodeJSON reads one JSON object from r into v: unknown fields, wrong types, trailing data,
// nesting deeper than maxJSONDepth and bodies over maxJSONBody are errors of class invalid
// argument (too large for the last).
func decodeJSON(w http.ResponseWriter, r *http.Request, v any) error {
	return decodeJSONLimit(w, r, v, maxJSONBody)
}

// jsonBodyTimeout bounds how long a client may take to send a JSON body: a client that sends
// one slowly (slowloris) holds a connection and a goroutine no longer than this.
const jsonBodyTimeout = 30 * time.Second

// decodeJSONLimit is decodeJSON with another size limit (template recipes carry files).
func decodeJSONLimit(w http.ResponseWriter, r *http.Request, v any, limit int64) error {
	lift := bodyDeadline(w)
	body := http.MaxBytesReader(w, r.Body, limit)
	buf, err := io.ReadAll(body)
	if err != nil {
		return readError(w, err)
	}
	lift()
	return decodeJSONFrom(bytes.NewReader(buf), v)
}

// bodyDeadline sets a read deadline of jsonBodyTimeout on the request's connection and returns
// the function that lifts it once the body is in (a deadline left behind would end the
// request's context while a long command runs). On a failed read it stays: the server then
// cannot wait on the client for the rest of the body, and closes the connection. Connections
// that cannot take deadlines (tests' recorders) are left alone.
func bodyDeadline(w http.ResponseWriter) func() {
	rc := http.NewResponseController(w)
	if rc.SetReadDeadline(time.Now().Add(jsonBodyTimeout)) != nil {
		return func() {}
	}
	return func() { _ = rc.SetReadDeadline(time.Time{}) }
}

// errBodyTimeout marks a body that did not arrive in time: the request's context is canceled
// by then (the connection failed a read), but the client is still there to be told.
var errBodyTimeout = errors.New("request body timed out")

// readError classifies a failure to read a request body.
func readError(w http.ResponseWriter, err error) error {
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		return errdefs.New(errdefs.ErrTooLarge, fmt.Sprintf("request body is larger than %d bytes", mbe.Limit))
	case errors.Is(err, os.ErrDeadlineExceeded):
		w.Header().Set("Connection", "close")
		return fmt.Errorf("%w: %w", errBodyTimeout, errdefs.InvalidArgument(fmt.Sprintf("request body not received within %s", jsonBodyTimeout)))
	}
	return errdefs.InvalidArgument("read body: " + err.Error())
}

// decodeJSONFrom decodes one JSON object from body (which the caller bounds) into v.
func decodeJSONFrom(body io.Reader, v any) error {
	buf, err := io.ReadAll(body)
	if err != nil {
		return errdefs.InvalidArgument("read body: " + err.Error())
	}
	if d := jsondepth.Of(buf); d > maxJSONDepth {
		return errdefs.InvalidArgument(fmt.Sprintf("invalid JSON body: nested more than %d deep", maxJSONDepth))
	}
	dec := json.NewDecoder(bytes.NewReader(buf))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, io.EOF) {
			return errdefs.InvalidArgument("request body is empty; want a JSON object")
		}
		return errdefs.InvalidArgument("invalid JSON body: " + err.Error())
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errdefs.InvalidArgument("invalid JSON body: data after the object")
	}
	return nil
}

// decodeOptionalJSON is decodeJSON for routes whose body may be empty.
func decodeOptionalJSON(w http.ResponseWriter, r *http.Request, v any) error {
	if r.ContentLength == 0 {
		return nil
	}
	lift := bodyDeadline(w)
	body := http.MaxBytesReader(w, r.Body, maxJSONBody)
	buf, err := io.ReadAll(body)
	if err != nil {
		return readError(w, err)
	}
	lift()
	if len(bytes.TrimSpace(buf)) == 0 {
		return nil
	}
	return decodeJSONFrom(bytes.NewReader(buf), v)
}

// maxPath is the longest path accepted (Linux PATH_MAX).
const maxPath = 4096

// cleanPath validates a path inside a sandbox: absolute, valid UTF-8 (the agent protocol's
// strings are), no NUL, not too long. It returns the cleaned form.
func cleanPath(field, p string) (string, error) {
	switch {
	case p == "":
		return "", errdefs.InvalidArgument(field + ": missing path")
	case len(p) > maxPath:
		return "", errdefs.InvalidArgument(fmt.Sprintf("%s: longer than %d bytes", field, maxPath))
	case strings.ContainsRune(p, 0):
		return "", errdefs.InvalidArgument(field + ": contains a NUL byte")
	case !utf8.ValidString(p):
		return "", errdefs.InvalidArgument(fmt.Sprintf("%s: %q is not valid UTF-8", field, p))
	case !strings.HasPrefix(p, "/"):
		return "", errdefs.InvalidArgument(fmt.Sprintf("%s: %q is not an absolute path", field, p))
	}
	return path.Clean(p), nil
}
