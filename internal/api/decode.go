package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path"
	"strings"
	"unicode/utf8"

	"github.com/space-sandbox/space/internal/errdefs"
)

// maxJSONBody bounds JSON request bodies.
const maxJSONBody = 1 << 20

// decodeJSON reads one JSON object from r into v: unknown fields, wrong types, trailing data and
// bodies over maxJSONBody are errors of class invalid argument (too large for the last).
func decodeJSON(w http.ResponseWriter, r *http.Request, v any) error {
	return decodeJSONLimit(w, r, v, maxJSONBody)
}

// decodeJSONLimit is decodeJSON with another size limit (template recipes carry files).
func decodeJSONLimit(w http.ResponseWriter, r *http.Request, v any, limit int64) error {
	body := http.MaxBytesReader(w, r.Body, limit)
	return decodeJSONFrom(body, v)
}

func decodeJSONFrom(body io.Reader, v any) error {
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return errdefs.New(errdefs.ErrTooLarge, fmt.Sprintf("request body is larger than %d bytes", mbe.Limit))
		}
		if errors.Is(err, io.EOF) {
			return errdefs.InvalidArgument("request body is empty; want a JSON object")
		}
		return errdefs.InvalidArgument("invalid JSON body: " + err.Error())
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return errdefs.New(errdefs.ErrTooLarge, fmt.Sprintf("request body is larger than %d bytes", mbe.Limit))
		}
		return errdefs.InvalidArgument("invalid JSON body: data after the object")
	}
	return nil
}

// decodeOptionalJSON is decodeJSON for routes whose body may be empty.
func decodeOptionalJSON(w http.ResponseWriter, r *http.Request, v any) error {
	if r.ContentLength == 0 {
		return nil
	}
	body := http.MaxBytesReader(w, r.Body, maxJSONBody)
	buf, err := io.ReadAll(body)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return errdefs.New(errdefs.ErrTooLarge, fmt.Sprintf("request body is larger than %d bytes", mbe.Limit))
		}
		return errdefs.InvalidArgument("read body: " + err.Error())
	}
	if strings.TrimSpace(string(buf)) == "" {
		return nil
	}
	return decodeJSONFrom(strings.NewReader(string(buf)), v)
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
