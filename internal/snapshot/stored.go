package snapshot

import (
	"context"
	"errors"
	"sync"

	"github.com/space-sandbox/space/internal/errdefs"
	"github.com/space-sandbox/space/internal/store"
)

// tenantChunks remembers which chunks each tenant's snapshots hold, so that a snapshot's
// stored_bytes counts what is new to its own tenant, not what is new to the whole store. The
// chunk store deduplicates across tenants; if stored_bytes counted only chunks new to the
// store, a tenant could learn that another tenant holds some data by snapshotting it and
// seeing nothing stored (a cross-tenant oracle). Chunks that only other tenants hold count at
// the size they take in the store, as if this tenant had stored them itself.
//
// A tenant's set is built on its first snapshot after start (from its snapshot records and
// their roots), grown on each snapshot and forgotten when one of its snapshots is deleted
// (rebuilt on the next). Concurrent snapshots of one tenant may both count a chunk they share;
// that errs towards more, never towards what other tenants hold.
type tenantChunks struct {
	mu   sync.Mutex
	held map[string]map[string]struct{} // tenant → chunk hashes its snapshots refer to
}

// StoredForTenant returns the bytes root sid (just committed) adds to tenant's own snapshots:
// the stored size of each chunk no other snapshot of tenant refers to, plus rootBytes.
func (s *Store) StoredForTenant(ctx context.Context, tenant, sid string, rootBytes int64) (int64, error) {
	chunks, err := s.chunks.RootChunks(sid)
	if err != nil {
		return 0, err
	}
	tc := &s.tenants
	tc.mu.Lock()
	defer tc.mu.Unlock()
	held, ok := tc.held[tenant]
	if !ok {
		if held, err = s.loadTenantChunks(ctx, tenant, sid); err != nil {
			return 0, err
		}
		if tc.held == nil {
			tc.held = map[string]map[string]struct{}{}
		}
		tc.held[tenant] = held
	}
	total := rootBytes
	for _, h := range chunks {
		if _, ok := held[h]; ok {
			continue
		}
		held[h] = struct{}{}
		n, _ := s.chunks.StoredSize(h)
		total += n
	}
	return total, nil
}

// loadTenantChunks collects the chunks of every snapshot of tenant but except.
func (s *Store) loadTenantChunks(ctx context.Context, tenant, except string) (map[string]struct{}, error) {
	recs, err := s.recs.ListSnapshots(ctx, store.SnapshotFilter{Tenant: tenant})
	if err != nil {
		return nil, err
	}
	held := map[string]struct{}{}
	for _, r := range recs {
		if r.ID == except {
			continue
		}
		chunks, err := s.chunks.RootChunks(r.ID)
		if errors.Is(err, errdefs.ErrNotFound) {
			continue // being deleted
		}
		if err != nil {
			return nil, err
		}
		for _, h := range chunks {
			held[h] = struct{}{}
		}
	}
	return held, nil
}

// ForgetTenant drops tenant's set after one of its snapshots went.
func (s *Store) ForgetTenant(tenant string) {
	s.tenants.mu.Lock()
	delete(s.tenants.held, tenant)
	s.tenants.mu.Unlock()
}
