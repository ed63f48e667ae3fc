package api

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/space-sandbox/space/internal/errdefs"
	"github.com/space-sandbox/space/internal/sandbox"
	"github.com/space-sandbox/space/internal/snapshot"
)

// IDs are opaque to clients (API.md): one of a shape no ID has names nothing, and answers 404
// as an unknown or another tenant's ID does, never 400, before anything else of the request is
// looked at. The sandbox manager's own shape checks (400) are not reached from here.

// maxNameLen is more than any ID or name is long (IDs are 24 bytes, names at most 63): a path
// parameter longer than that names nothing, and is not echoed whole in the answer.
const maxNameLen = 255

// pathIDError returns the not-found error for a path parameter of r's route that cannot be an
// ID, or nil.
func pathIDError(r *http.Request) error {
	for kind, param := range map[string]string{"key": "id", "secret": "name", "template": "name"} {
		if strings.Contains(r.Pattern, "/v1/"+kind+"s/{"+param+"}") && len(r.PathValue(param)) > maxNameLen {
			return unknownID(kind, r.PathValue(param))
		}
	}
	if strings.Contains(r.Pattern, "/v1/sandboxes/{id}") && !sandbox.ValidID(r.PathValue("id")) {
		return unknownID("sandbox", r.PathValue("id"))
	}
	if strings.Contains(r.Pattern, "/v1/snapshots/{sid}") && !snapshot.ValidID(r.PathValue("sid")) {
		return unknownID("snapshot", r.PathValue("sid"))
	}
	return nil
}

// snapshotRefError is pathIDError for a snapshot ID given in a body or query field.
func snapshotRefError(sid string) error {
	if !snapshot.ValidID(sid) {
		return unknownID("snapshot", sid)
	}
	return nil
}

// unknownID is the error for an ID that names nothing; a long one is cut short in the message.
func unknownID(kind, id string) error {
	if len(id) > 64 {
		id = id[:64] + "…"
	}
	return errdefs.NotFound(fmt.Sprintf("%s %q not found", kind, id))
}
