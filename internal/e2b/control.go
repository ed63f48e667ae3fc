package e2b

import (
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/space-sandbox/space/internal/auth"
	"github.com/space-sandbox/space/internal/errdefs"
	"github.com/space-sandbox/space/internal/sandbox"
	"github.com/space-sandbox/space/internal/snapshot"
)

// sandboxJSON is E2B's Sandbox (create and connect responses).
type sandboxJSON struct {
	SandboxID       string  `json:"sandboxID"`
	TemplateID      string  `json:"templateID"`
	ClientID        string  `json:"clientID"`
	EnvdVersion     string  `json:"envdVersion"`
	EnvdAccessToken string  `json:"envdAccessToken"`
	Domain          *string `json:"domain"`
	// TrafficAccessToken guards the sandbox's ports when it asked for that.
	TrafficAccessToken string `json:"trafficAccessToken,omitempty"`
}

// listedJSON is E2B's ListedSandbox; with the token and domain, its SandboxDetail.
type listedJSON struct {
	SandboxID       string            `json:"sandboxID"`
	TemplateID      string            `json:"templateID"`
	ClientID        string            `json:"clientID"`
	StartedAt       time.Time         `json:"startedAt"`
	EndAt           time.Time         `json:"endAt"`
	State           string            `json:"state"`
	CPUCount        int               `json:"cpuCount"`
	MemoryMB        int64             `json:"memoryMB"`
	DiskSizeMB      int64             `json:"diskSizeMB"`
	EnvdVersion     string            `json:"envdVersion"`
	Metadata        map[string]string `json:"metadata"`
	EnvdAccessToken string            `json:"envdAccessToken,omitempty"`
	Domain          *string           `json:"domain,omitempty"`
}

const clientID = "space"

func (h *Handler) domain() *string {
	if h.cfg.Domain == "" {
		return nil
	}
	d := h.cfg.Domain
	return &d
}

func (h *Handler) sandboxOf(info sandbox.Info, token string) sandboxJSON {
	return sandboxJSON{SandboxID: info.ID, TemplateID: info.Template, ClientID: clientID, EnvdVersion: EnvdVersion,
		EnvdAccessToken: token, Domain: h.domain()}
}

func (h *Handler) listedOf(info sandbox.Info) listedJSON {
	state := string(info.State)
	if state != string(sandbox.StatePaused) {
		state = "running"
	}
	end := info.ExpiresAt
	if end.IsZero() {
		end = time.Now().UTC()
	}
	return listedJSON{SandboxID: info.ID, TemplateID: info.Template, ClientID: clientID, StartedAt: info.CreatedAt,
		EndAt: end, State: state, CPUCount: info.Spec.Resources.VCPUs, MemoryMB: info.Spec.Resources.MemoryMiB,
		DiskSizeMB: info.Spec.Resources.DiskMiB, EnvdVersion: EnvdVersion, Metadata: info.Metadata}
}

// reply writes a Sandbox for info with its access token.
func (h *Handler) reply(w http.ResponseWriter, r *http.Request, p auth.Principal, status int, info sandbox.Info) {
	token, err := h.sb.AccessToken(p.Tenant, info.ID)
	if err != nil {
		h.writeError(w, err)
		return
	}
	out := h.sandboxOf(info, token)
	if out.TrafficAccessToken, err = h.sb.TrafficToken(p.Tenant, info.ID); err != nil {
		h.writeError(w, err)
		return
	}
	writeJSON(w, status, out)
}

func (h *Handler) create(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	var req struct {
		TemplateID          string            `json:"templateID"`
		Timeout             *int              `json:"timeout"`
		Metadata            map[string]string `json:"metadata"`
		EnvVars             map[string]string `json:"envVars"`
		AutoPause           bool              `json:"autoPause"`
		AllowInternetAccess *bool             `json:"allow_internet_access"`
		Network             *struct {
			AllowPublicTraffic *bool `json:"allowPublicTraffic"`
		} `json:"network"`
	}
	if err := decode(r, &req); err != nil {
		h.writeError(w, err)
		return
	}
	cr := sandbox.CreateRequest{Template: req.TemplateID, TimeoutSeconds: req.Timeout, Metadata: req.Metadata,
		Env: req.EnvVars}
	switch cr.Template {
	case "":
		cr.Template = "base"
	case "code-interpreter-v1": // what @e2b/code-interpreter asks for by default
		cr.Template = "code-interpreter"
	}
	if req.AutoPause {
		cr.OnTimeout = "pause"
	}
	if req.Network != nil && req.Network.AllowPublicTraffic != nil && !*req.Network.AllowPublicTraffic {
		cr.TrafficToken = true
	}
	if req.AllowInternetAccess != nil && !*req.AllowInternetAccess {
		cr.Network = &sandbox.Network{Egress: sandbox.Egress{Default: "deny"}}
	}
	info, err := h.sb.Create(r.Context(), p.Tenant, cr)
	if err != nil {
		h.writeError(w, err)
		return
	}
	h.reply(w, r, p, http.StatusCreated, info)
}

func (h *Handler) get(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	info, err := h.sb.Get(r.Context(), p.Tenant, r.PathValue("id"))
	if err != nil {
		h.writeError(w, err)
		return
	}
	token, err := h.sb.AccessToken(p.Tenant, info.ID)
	if err != nil {
		h.writeError(w, err)
		return
	}
	d := h.listedOf(info)
	d.EnvdAccessToken, d.Domain = token, h.domain()
	writeJSON(w, http.StatusOK, d)
}

// listV1 serves GET /sandboxes: the running sandboxes, no paging.
func (h *Handler) listV1(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	infos, err := h.sb.List(r.Context(), p.Tenant, sandbox.ListFilter{States: []string{string(sandbox.StateRunning)}})
	if err != nil {
		h.writeError(w, err)
		return
	}
	out := make([]listedJSON, 0, len(infos))
	for _, i := range infos {
		out = append(out, h.listedOf(i))
	}
	writeJSON(w, http.StatusOK, out)
}

// list serves GET /v2/sandboxes: filtered by state and metadata, paged with x-next-token.
func (h *Handler) list(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	q := r.URL.Query()
	f := sandbox.ListFilter{Metadata: map[string]string{}}
	states := []string{"running", "paused"}
	if s := q.Get("state"); s != "" {
		states = strings.Split(s, ",")
	}
	for _, s := range states {
		switch s {
		case "running", "paused":
		default:
			h.writeError(w, errdefs.InvalidArgument("state: want running or paused"))
			return
		}
	}
	if md := q.Get("metadata"); md != "" {
		vals, err := url.ParseQuery(md)
		if err != nil {
			h.writeError(w, errdefs.InvalidArgument("metadata: want k=v&k2=v2"))
			return
		}
		for k := range vals {
			f.Metadata[k] = vals.Get(k)
		}
	}
	infos, err := h.sb.List(r.Context(), p.Tenant, f)
	if err != nil {
		h.writeError(w, err)
		return
	}
	var match []listedJSON
	for _, i := range infos {
		l := h.listedOf(i)
		for _, s := range states {
			if l.State == s && (i.State == sandbox.StateRunning || i.State == sandbox.StatePaused) {
				match = append(match, l)
				break
			}
		}
	}
	sort.SliceStable(match, func(a, b int) bool { return match[a].StartedAt.Before(match[b].StartedAt) })
	limit := 100
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 1000 {
			h.writeError(w, errdefs.InvalidArgument("limit: want 1..1000"))
			return
		}
		limit = n
	}
	start := 0
	if s := q.Get("nextToken"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			h.writeError(w, errdefs.InvalidArgument("nextToken: not a token this server gave"))
			return
		}
		start = min(n, len(match))
	}
	end := min(start+limit, len(match))
	if end < len(match) {
		w.Header().Set("x-next-token", strconv.Itoa(end))
	}
	page := match[start:end]
	if page == nil {
		page = []listedJSON{}
	}
	writeJSON(w, http.StatusOK, page)
}

func (h *Handler) kill(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	if err := h.sb.Delete(r.Context(), p.Tenant, r.PathValue("id")); err != nil {
		h.writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (h *Handler) timeout(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	var req struct {
		Timeout int `json:"timeout"`
	}
	if err := decode(r, &req); err != nil {
		h.writeError(w, err)
		return
	}
	if _, err := h.sb.SetTimeout(r.Context(), p.Tenant, r.PathValue("id"), req.Timeout); err != nil {
		h.writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (h *Handler) pause(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	if _, err := h.sb.Pause(r.Context(), p.Tenant, r.PathValue("id")); err != nil {
		h.writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// connect serves connect (v1 and v2) and resume: 200 if the sandbox was running, 201 if it was
// resumed; the same token as ever.
func (h *Handler) connect(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	var req struct {
		Timeout *int `json:"timeout"`
	}
	if err := decode(r, &req); err != nil {
		h.writeError(w, err)
		return
	}
	resumed, info, err := h.sb.Connect(r.Context(), p.Tenant, r.PathValue("id"))
	if err != nil {
		h.writeError(w, err)
		return
	}
	if req.Timeout != nil && *req.Timeout > 0 {
		if info, err = h.sb.SetTimeout(r.Context(), p.Tenant, info.ID, *req.Timeout); err != nil {
			h.writeError(w, err)
			return
		}
	}
	status := http.StatusOK
	if resumed {
		status = http.StatusCreated
	}
	h.reply(w, r, p, status, info)
}

// metrics answers one sample, taken now, of the sandbox's use (E2B's SandboxMetric list). CPU
// use is measured over 200 ms.
func (h *Handler) metrics(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	id := r.PathValue("id")
	u1, res, err := h.sb.Usage(r.Context(), p.Tenant, id)
	if err != nil {
		h.writeError(w, err)
		return
	}
	t1 := time.Now()
	time.Sleep(200 * time.Millisecond)
	u2, _, err := h.sb.Usage(r.Context(), p.Tenant, id)
	if err != nil {
		h.writeError(w, err)
		return
	}
	cpus := max(res.VCPUs, 1)
	pct := (u2.CPUSeconds - u1.CPUSeconds) / time.Since(t1).Seconds() / float64(cpus) * 100
	now := time.Now().UTC()
	writeJSON(w, http.StatusOK, []map[string]any{{
		"timestamp": now, "timestampUnix": now.Unix(), "cpuCount": cpus, "cpuUsedPct": max(pct, 0),
		"memUsed": u2.MemoryBytes, "memTotal": u2.MemoryLimit, "memCache": 0,
		"diskUsed": u2.DiskBytes, "diskTotal": res.DiskMiB << 20,
	}})
}

func (h *Handler) network(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	var req struct {
		AllowOut []string `json:"allowOut"`
		DenyOut  []string `json:"denyOut"`
	}
	if err := decode(r, &req); err != nil {
		h.writeError(w, err)
		return
	}
	e := sandbox.Egress{Allow: req.AllowOut, Deny: req.DenyOut}
	if len(req.AllowOut) > 0 {
		e.Default = "deny"
	}
	if _, err := h.sb.UpdateNetwork(r.Context(), p.Tenant, r.PathValue("id"), e); err != nil {
		h.writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

type snapshotJSON struct {
	SnapshotID string   `json:"snapshotID"`
	Names      []string `json:"names"`
}

func snapshotOf(s snapshot.Info) snapshotJSON {
	names := []string{}
	if s.Label != "" {
		names = append(names, s.Label)
	}
	return snapshotJSON{SnapshotID: s.ID, Names: names}
}

// snapshot takes a full snapshot (E2B's snapshots hold memory and processes).
func (h *Handler) snapshot(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	var req struct {
		Name string `json:"name"`
	}
	if err := decode(r, &req); err != nil {
		h.writeError(w, err)
		return
	}
	s, err := h.sb.Snapshot(r.Context(), p.Tenant, r.PathValue("id"), snapshot.Request{Kind: snapshot.KindFull, Label: req.Name})
	if err != nil {
		h.writeError(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, snapshotOf(s))
}

func (h *Handler) listSnapshots(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	list, err := h.sb.AllSnapshots(r.Context(), p.Tenant)
	if err != nil {
		h.writeError(w, err)
		return
	}
	q := r.URL.Query()
	out := []snapshotJSON{}
	for _, s := range list {
		if id := q.Get("sandboxID"); id != "" && s.SandboxID != id {
			continue
		}
		if name := q.Get("name"); name != "" && s.Label != name {
			continue
		}
		out = append(out, snapshotOf(s))
	}
	writeJSON(w, http.StatusOK, out)
}

func (h *Handler) deleteSnapshot(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	if err := h.sb.DeleteSnapshot(r.Context(), p.Tenant, r.PathValue("id")); err != nil {
		h.writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (h *Handler) fork(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	var req struct {
		Count int `json:"count"`
	}
	if err := decode(r, &req); err != nil {
		h.writeError(w, err)
		return
	}
	if req.Count == 0 {
		req.Count = 1
	}
	copies, err := h.sb.Fork(r.Context(), p.Tenant, r.PathValue("id"), req.Count)
	if err != nil {
		h.writeError(w, err)
		return
	}
	type item struct {
		Sandbox sandboxJSON `json:"sandbox"`
	}
	out := make([]item, 0, len(copies))
	for _, c := range copies {
		token, err := h.sb.AccessToken(p.Tenant, c.ID)
		if err != nil {
			h.writeError(w, err)
			return
		}
		out = append(out, item{Sandbox: h.sandboxOf(c, token)})
	}
	writeJSON(w, http.StatusCreated, out)
}
