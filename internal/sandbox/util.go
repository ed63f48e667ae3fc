package sandbox

import (
	"encoding/json"
	"fmt"

	"github.com/space-sandbox/space/internal/store"
)

func storeFilter(tenant string, f ListFilter) store.SandboxFilter {
	return store.SandboxFilter{Tenant: tenant, States: f.States, Metadata: f.Metadata}
}

func decodeSpec(raw json.RawMessage) (Spec, error) {
	var s Spec
	if len(raw) == 0 {
		return s, nil
	}
	if err := json.Unmarshal(raw, &s); err != nil {
		return s, fmt.Errorf("decode stored spec: %w", err)
	}
	return s, nil
}
