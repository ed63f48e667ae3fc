package sandbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/space-sandbox/space/internal/crashpoint"
	"github.com/space-sandbox/space/internal/egress/credentials"
	"github.com/space-sandbox/space/internal/errdefs"
	"github.com/space-sandbox/space/internal/runtime"
	"github.com/space-sandbox/space/internal/snapshot"
	"github.com/space-sandbox/space/internal/store"
)

// Defaults applied to resources a request leaves at zero.
const (
	defaultVCPUs     = 1
	defaultMemoryMiB = 512
	defaultDiskMiB   = 2048
)

// Create makes a sandbox for tenant and returns once its agent answers. On any failure it removes
// everything it made (runtime, slot, record) and returns the error.
func (m *Manager) Create(ctx context.Context, tenant string, req CreateRequest) (Info, error) {
	if req.FromSnapshot != "" {
		return m.createFromSnapshot(ctx, tenant, req)
	}
	rec, spec, err := m.prepare(ctx, tenant, req)
	if err != nil {
		return Info{}, err
	}
	defer m.unreserve(tenant)
	if m.eligible(req) {
		if b := m.claim(ctx, rec, spec); b != nil {
			defer b.mu.Unlock()
			m.publish(EventCreated, b.rec, "")
			m.log.Info("sandbox created", "id", b.rec.ID, "tenant", tenant, "template", b.rec.Template, "warm", true)
			return infoOf(b.rec, b.spec), nil
		}
	}
	drv := m.cfg.Drivers[rec.Runtime]
	t0 := time.Now()
	tpl, err := m.cfg.Templates(ctx, rec.Template)
	if err != nil {
		return Info{}, fmt.Errorf("template %s: %w", rec.Template, err)
	}
	// Its time starts now: waiting for a template to be built (minutes, the first time) is
	// not the sandbox's.
	now := m.cfg.Now().UTC()
	rec.CreatedAt, rec.UpdatedAt = now, now
	rec.ExpiresAt = now.Add(time.Duration(rec.TimeoutSeconds) * time.Second)
	b0 := newBox(rec, spec)
	applyTemplate(b0, tpl)
	rec, spec = b0.rec, b0.spec
	tTemplate := time.Since(t0)
	if err := m.recordNew(ctx, rec, spec); err != nil {
		return Info{}, err
	}
	m.crash(crashpoint.CreateRecorded)
	tRecord := time.Since(t0)
	b := newBox(rec, spec)
	b.mu.Lock()
	defer b.mu.Unlock()
	m.register(b)

	// Once started, the sandbox is recorded whatever the caller does: no half-made sandboxes.
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	err = m.start(ctx, b, drv, tpl)
	tStarted := time.Since(t0)
	if err == nil {
		m.crash(crashpoint.CreateStarted)
		err = m.setState(pctx, b, StateRunning, "")
	}
	if err != nil {
		m.abandon(pctx, b)
		m.log.Warn("create failed", "id", rec.ID, "err", err)
		return Info{}, err
	}
	m.log.Debug("create timing", "id", rec.ID, "template", tTemplate, "record", tRecord-tTemplate,
		"start", tStarted-tRecord, "persist", time.Since(t0)-tStarted)
	m.publish(EventCreated, b.rec, "")
	m.log.Info("sandbox created", "id", rec.ID, "tenant", tenant, "template", rec.Template)
	return infoOf(b.rec, b.spec), nil
}

// prepare validates req and builds the record to store.
func (m *Manager) prepare(ctx context.Context, tenant string, req CreateRequest) (store.Sandbox, Spec, error) {
	if req.Template == "" {
		req.Template = m.cfg.DefaultTemplate
	}
	if !nameRE.MatchString(req.Template) {
		return store.Sandbox{}, Spec{}, errdefs.InvalidArgument(fmt.Sprintf("template %q: not a template name", req.Template))
	}
	if req.Runtime == "" {
		req.Runtime = m.cfg.DefaultRuntime
	}
	drv, ok := m.cfg.Drivers[req.Runtime]
	if !ok {
		return store.Sandbox{}, Spec{}, errdefs.InvalidArgument(fmt.Sprintf("runtime %q is not available on this server", req.Runtime))
	}
	if err := drv.Available(ctx); err != nil {
		return store.Sandbox{}, Spec{}, errdefs.New(errdefs.ErrUnavailable, fmt.Sprintf("runtime %s: %v", req.Runtime, err))
	}
	timeout := m.cfg.DefaultTimeout
	if req.TimeoutSeconds != nil {
		if *req.TimeoutSeconds <= 0 || *req.TimeoutSeconds > int(m.cfg.MaxTimeout/time.Second) {
			return store.Sandbox{}, Spec{}, errdefs.InvalidArgument(fmt.Sprintf("timeout_seconds: want 1..%d", int(m.cfg.MaxTimeout.Seconds())))
		}
		timeout = time.Duration(*req.TimeoutSeconds) * time.Second
	}
	switch req.OnTimeout {
	case "":
		req.OnTimeout = "kill"
	case "kill":
	case "pause":
		if _, ok := drv.(runtime.Checkpointer); !ok || m.cfg.StateDir == "" {
			return store.Sandbox{}, Spec{}, errdefs.InvalidArgument(fmt.Sprintf(`on_timeout "pause": runtime %s cannot pause`, req.Runtime))
		}
	default:
		return store.Sandbox{}, Spec{}, errdefs.InvalidArgument(fmt.Sprintf("on_timeout %q: want kill or pause", req.OnTimeout))
	}
	if err := validateMap("env", req.Env, envKeyRE); err != nil {
		return store.Sandbox{}, Spec{}, err
	}
	if err := validateMap("metadata", req.Metadata, nil); err != nil {
		return store.Sandbox{}, Spec{}, err
	}
	if err := validateResources(req.Resources); err != nil {
		return store.Sandbox{}, Spec{}, err
	}
	if err := m.checkCapacity(req.Resources); err != nil {
		return store.Sandbox{}, Spec{}, err
	}
	spec := Spec{Resources: req.Resources, Network: Network{Egress: Egress{Default: m.cfg.DefaultEgress}}}
	if req.Network != nil {
		spec.Network = *req.Network
		if spec.Network.Egress.Default == "" {
			spec.Network.Egress.Default = m.cfg.DefaultEgress
		}
	}
	if err := validateNetwork(spec.Network); err != nil {
		return store.Sandbox{}, Spec{}, err
	}
	if err := m.checkCredentials(ctx, tenant, spec.Network.Credentials); err != nil {
		return store.Sandbox{}, Spec{}, err
	}
	if len(spec.Network.Credentials) > 0 {
		// The sandbox sees a placeholder per credential, never the value.
		env := make(map[string]string, len(req.Env)+len(spec.Network.Credentials))
		for k, v := range req.Env {
			env[k] = v
		}
		for _, c := range spec.Network.Credentials {
			k, v := credentials.Placeholder(c)
			env[k] = v
		}
		req.Env = env
	}
	if a := req.AutoSnapshot; a != nil {
		if a.IntervalSeconds < snapshot.MinAutoInterval || a.IntervalSeconds > 86400 {
			return store.Sandbox{}, Spec{}, errdefs.InvalidArgument(fmt.Sprintf("auto_snapshot.interval_seconds: want %d..86400", snapshot.MinAutoInterval))
		}
		if a.Keep == 0 {
			a.Keep = snapshot.DefaultAutoKeep
		}
		if a.Keep < 1 || a.Keep > 100 {
			return store.Sandbox{}, Spec{}, errdefs.InvalidArgument("auto_snapshot.keep: want 1..100")
		}
		if _, ok := drv.(runtime.LayerCapturer); !ok || m.cfg.Chunks == nil {
			return store.Sandbox{}, Spec{}, errdefs.InvalidArgument(fmt.Sprintf("auto_snapshot: runtime %s cannot snapshot files on this server", req.Runtime))
		}
		auto := *a
		spec.AutoSnapshot = &auto
	}
	if req.TrafficToken {
		spec.TrafficToken = newToken()
	}
	if spec.Resources.VCPUs == 0 {
		spec.Resources.VCPUs = defaultVCPUs
	}
	if spec.Resources.MemoryMiB == 0 {
		spec.Resources.MemoryMiB = defaultMemoryMiB
	}
	if spec.Resources.DiskMiB == 0 {
		spec.Resources.DiskMiB = defaultDiskMiB
	}
	if err := m.reserve(tenant); err != nil {
		return store.Sandbox{}, Spec{}, err
	}
	now := m.cfg.Now().UTC()
	rec := store.Sandbox{
		ID: newID("sbx_", 20), Tenant: tenant, State: string(StateCreating),
		Template: req.Template, Runtime: req.Runtime, CreatedAt: now, UpdatedAt: now,
		ExpiresAt: now.Add(timeout), TimeoutSeconds: int(timeout.Seconds()), OnTimeout: req.OnTimeout,
		Metadata: req.Metadata, Env: req.Env, AccessToken: newToken(), SlotIndex: -1,
		Spec: encodeSpec(spec),
	}
	return rec, spec, nil
}

// reserve admits one create for tenant under its quota; unreserve ends the admission once the
// sandbox is registered (or failed). The warm pool's tenant has no quota.
func (m *Manager) reserve(tenant string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if tenant == warmTenant {
		return nil
	}
	n := m.pending[tenant]
	for _, b := range m.boxes {
		if b.tenant == tenant {
			n++
		}
	}
	if n >= m.cfg.MaxPerTenant {
		return errdefs.New(errdefs.ErrResourceExhausted, fmt.Sprintf("tenant has %d live sandboxes; the limit is %d", n, m.cfg.MaxPerTenant))
	}
	m.pending[tenant]++
	return nil
}

func (m *Manager) unreserve(tenant string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if tenant == warmTenant {
		return
	}
	if m.pending[tenant]--; m.pending[tenant] <= 0 {
		delete(m.pending, tenant)
	}
}

// start acquires a slot, starts the runtime and waits for the agent. The caller holds b.mu.
func (m *Manager) start(ctx context.Context, b *box, drv runtime.Driver, tpl Template) error {
	t0 := time.Now()
	slot, err := m.cfg.Slots.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("network slot: %w", err)
	}
	b.slot = slot
	b.rec.SlotIndex = slot.Index
	if err := m.cfg.Store.UpdateSandbox(ctx, b.rec); err != nil {
		return fmt.Errorf("record slot: %w", err)
	}
	tSlot := time.Since(t0)
	if err := drv.Create(ctx, m.runtimeSpec(b, tpl)); err != nil {
		return fmt.Errorf("start runtime: %w", err)
	}
	tRuntime := time.Since(t0)
	defer func() {
		m.log.Debug("start timing", "id", b.rec.ID, "slot", tSlot, "runtime", tRuntime-tSlot, "agent", time.Since(t0)-tRuntime)
	}()
	m.setClient(b)
	rctx, cancel := context.WithTimeout(ctx, m.cfg.ReadyTimeout)
	defer cancel()
	if err := b.client.WaitReady(rctx); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return errdefs.New(errdefs.ErrUnavailable, fmt.Sprintf("sandbox agent did not become ready in %s: %v", m.cfg.ReadyTimeout, err))
	}
	if tpl.Start != nil {
		if err := m.startService(rctx, b, *tpl.Start); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
	}
	return nil
}

// runtimeSpec is what the runtime needs to start (or restore) b from tpl in b's slot.
func (m *Manager) runtimeSpec(b *box, tpl Template) runtime.Spec {
	env := make(map[string]string, len(tpl.Env)+len(b.rec.Env)+4)
	if len(m.cfg.EgressCA) > 0 {
		for _, k := range []string{"SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"} {
			env[k] = "/etc/space/ca-bundle.crt"
		}
		env["NODE_EXTRA_CA_CERTS"] = "/etc/space/ca.crt"
	}
	for k, v := range tpl.Env {
		env[k] = v
	}
	for k, v := range b.rec.Env {
		env[k] = v
	}
	slot := b.slot
	return runtime.Spec{
		ID: b.rec.ID, RootFS: tpl.RootFS, Layers: tpl.Layers, AgentPath: m.cfg.AgentPath, AgentToken: b.rec.AccessToken,
		Env: env, Hostname: hostname(b.rec.ID), CACert: m.cfg.EgressCA,
		Resources: runtime.Resources{VCPUs: b.spec.Resources.VCPUs, MemoryMiB: b.spec.Resources.MemoryMiB, DiskMiB: b.spec.Resources.DiskMiB, Pids: b.spec.Resources.Pids},
		Network: runtime.Network{
			NetNSPath: slot.NetNSPath, Interface: slot.GuestIf, GuestIP: slot.GuestIP, Gateway: slot.HostIP,
		},
	}
}

// applyTemplate records the template's command defaults in b's spec. The caller owns b.
func applyTemplate(b *box, tpl Template) {
	b.spec.WorkingDir, b.spec.User, b.spec.Start = tpl.WorkingDir, tpl.User, tpl.Start
	b.spec.RootFS, b.spec.Layers = tpl.RootFS, tpl.Layers
	b.rec.Spec = encodeSpec(b.spec)
	b.refresh()
}

// hostname is the sandbox's host name: its ID without the prefix underscore (not valid in names).
func hostname(id string) string { return "sbx-" + id[len("sbx_"):] }

// abandon removes everything of a sandbox whose making failed: runtime, slot, registration and
// record. The caller holds b.mu.
func (m *Manager) abandon(ctx context.Context, b *box) {
	_ = m.teardown(ctx, b)
	m.mu.Lock()
	delete(m.boxes, b.rec.ID)
	m.mu.Unlock()
	// creating → deleted: nobody was told it exists. If the record stays (the store failed),
	// Recover finishes it off.
	if err := m.setState(ctx, b, StateDeleted, ""); err != nil {
		m.log.Error("remove record of failed sandbox", "id", b.rec.ID, "err", err)
	}
}

// teardown removes the runtime, the slot and the checkpoint of b, logging what fails. The caller
// holds b.mu. It returns the first error.
func (m *Manager) teardown(ctx context.Context, b *box) error {
	err := m.stopRuntime(ctx, b, "stopped")
	if m.cfg.StateDir != "" {
		if rerr := m.removeCheckpoint(b.rec.ID); rerr != nil {
			m.log.Error("remove checkpoint", "id", b.rec.ID, "err", rerr)
			err = errors.Join(err, fmt.Errorf("remove checkpoint: %w", rerr))
		}
	}
	return err
}
