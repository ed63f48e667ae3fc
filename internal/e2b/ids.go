package e2b

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/space-sandbox/space/internal/errdefs"
	"github.com/space-sandbox/space/internal/sandbox"
	"github.com/space-sandbox/space/internal/snapshot"
)

// pathIDError returns the not-found error for a path ID of r's route that no sandbox or
// snapshot can have, or nil. E2B answers 404 for any sandbox ID it does not know, whatever its
// shape (and the SDK raises NotFoundException on it), so an ID of the wrong shape is just one
// that names nothing, as another tenant's is.
func pathIDError(r *http.Request) error {
	id := r.PathValue("id")
	switch {
	case strings.Contains(r.Pattern, "/sandboxes/{id}") && !sandbox.ValidID(id):
		return unknownID("sandbox", id)
	case strings.Contains(r.Pattern, "/templates/{id}") && !snapshot.ValidID(id):
		return unknownID("template", id) // E2B's templates here are snapshots
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
