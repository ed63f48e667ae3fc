// Package credentials keeps tenants' credential secrets for the egress gateway: it stores them
// sealed (internal/secrets), lists and deletes them, checks the names a sandbox asks for and
// opens them for the gateway, which sets them on the sandbox's TLS requests to their hosts; the
// sandbox itself only ever sees a placeholder. The API and cmd/spaced import it; the sandbox
// lifecycle uses it through sandbox.Credentials (and Placeholder, ValidName).
package credentials

import (
	"context"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"time"

	"github.com/space-sandbox/space/internal/egress"
	"github.com/space-sandbox/space/internal/errdefs"
	"github.com/space-sandbox/space/internal/secrets"
	"github.com/space-sandbox/space/internal/store"
)

// Store is where the sealed secrets live; store.Store implements it.
type Store interface {
	PutSecret(ctx context.Context, s store.Secret) error
	GetSecret(ctx context.Context, tenant, name string) (store.Secret, error)
	ListSecrets(ctx context.Context, tenant string) ([]store.Secret, error)
	DeleteSecret(ctx context.Context, tenant, name string) error
}

// Config holds a Vault's dependencies.
type Config struct {
	Store  Store
	Box    *secrets.Box // seals the values; without it the vault keeps no secrets
	Logger *slog.Logger
	Now    func() time.Time // default time.Now
}

// Vault is tenants' credential secrets. Its methods are safe to call concurrently.
type Vault struct {
	cfg Config
	log *slog.Logger
}

// New returns a Vault.
func New(cfg Config) *Vault {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Vault{cfg: cfg, log: cfg.Logger}
}

// Request stores a credential: Value is set as Header (Format with "{value}" replaced) on
// TLS requests to Hosts from sandboxes created with the secret's name in network.credentials.
type Request struct {
	Value  string
	Hosts  []string
	Header string
	Format string
}

// Info is a secret as the API lists it: never its value.
type Info struct {
	Name      string    `json:"name"`
	Hosts     []string  `json:"hosts"`
	Header    string    `json:"header"`
	CreatedAt time.Time `json:"created_at"`
}

var (
	secretNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)
	headerRE     = regexp.MustCompile(`^[A-Za-z0-9!#$%&'*+.^_` + "`" + `|~-]{1,64}$`)
)

// ValidName reports whether s has the shape of a secret name.
func ValidName(s string) bool { return secretNameRE.MatchString(s) }

func (m *Vault) secretBox() error {
	if m.cfg.Box == nil || m.cfg.Store == nil {
		return errdefs.New(errdefs.ErrFailedPrecondition, "this server keeps no secrets")
	}
	return nil
}

// Put creates or replaces one of tenant's secrets. The value is sealed before it is stored.
func (m *Vault) Put(ctx context.Context, tenant, name string, req Request) error {
	if err := m.secretBox(); err != nil {
		return err
	}
	if !secretNameRE.MatchString(name) {
		return errdefs.InvalidArgument(fmt.Sprintf("secret name %q: lowercase letters, digits, '_' and '-', up to 63", name))
	}
	if req.Value == "" || len(req.Value) > 8192 || strings.ContainsAny(req.Value, "\r\n\x00") {
		return errdefs.InvalidArgument("value: 1 to 8192 bytes, no line breaks or NUL")
	}
	if len(req.Hosts) == 0 || len(req.Hosts) > 64 {
		return errdefs.InvalidArgument("hosts: 1 to 64 host names")
	}
	for _, h := range req.Hosts {
		r, err := egress.ParseRule(h)
		if err != nil || r.Host == "" {
			return errdefs.InvalidArgument(fmt.Sprintf("hosts: %q is not a host name or *.wildcard", h))
		}
	}
	if req.Header == "" {
		req.Header = "Authorization"
	}
	if !headerRE.MatchString(req.Header) {
		return errdefs.InvalidArgument(fmt.Sprintf("header %q is not a header name", req.Header))
	}
	if req.Format == "" {
		req.Format = "Bearer {value}"
	}
	if !strings.Contains(req.Format, "{value}") || len(req.Format) > 256 || strings.ContainsAny(req.Format, "\r\n\x00") {
		return errdefs.InvalidArgument(`format: must contain "{value}", one line, up to 256 characters`)
	}
	sealed := m.cfg.Box.Seal([]byte(req.Value), tenant+"/"+name)
	err := m.cfg.Store.PutSecret(ctx, store.Secret{Tenant: tenant, Name: name, Hosts: req.Hosts, Header: req.Header,
		Format: req.Format, Ciphertext: sealed, CreatedAt: m.cfg.Now().UTC()})
	if err == nil {
		m.log.Info("secret stored", "tenant", tenant, "name", name, "hosts", req.Hosts)
	}
	return err
}

// List lists tenant's secrets without their values.
func (m *Vault) List(ctx context.Context, tenant string) ([]Info, error) {
	if m.cfg.Store == nil {
		return []Info{}, nil
	}
	list, err := m.cfg.Store.ListSecrets(ctx, tenant)
	if err != nil {
		return nil, err
	}
	out := make([]Info, 0, len(list))
	for _, s := range list {
		out = append(out, Info{Name: s.Name, Hosts: s.Hosts, Header: s.Header, CreatedAt: s.CreatedAt})
	}
	return out, nil
}

// Delete removes one of tenant's secrets; sandboxes that named it stop getting it.
func (m *Vault) Delete(ctx context.Context, tenant, name string) error {
	if !secretNameRE.MatchString(name) || m.cfg.Store == nil {
		return errdefs.NotFound(fmt.Sprintf("secret %q not found", name))
	}
	if err := m.cfg.Store.DeleteSecret(ctx, tenant, name); err != nil {
		return err
	}
	m.log.Info("secret deleted", "tenant", tenant, "name", name)
	return nil
}

// Placeholder is the environment variable a sandbox sees for a credential: its name, never its
// value.
func Placeholder(name string) (string, string) {
	return "SPACE_SECRET_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_")), "space-placeholder-" + name
}

// Check makes sure every credential a sandbox names is one of tenant's secrets.
func (m *Vault) Check(ctx context.Context, tenant string, names []string) error {
	if len(names) > 0 {
		if err := m.secretBox(); err != nil {
			return errdefs.InvalidArgument("network.credentials: this server keeps no secrets")
		}
	}
	for _, n := range names {
		if _, err := m.cfg.Store.GetSecret(ctx, tenant, n); err != nil {
			return errdefs.InvalidArgument(fmt.Sprintf("network.credentials: unknown secret %q", n))
		}
	}
	return nil
}

// Open opens the secrets a sandbox names, for the gateway.
func (m *Vault) Open(tenant string, names []string) []egress.Credential {
	if len(names) == 0 || m.cfg.Box == nil || m.cfg.Store == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var out []egress.Credential
	for _, n := range names {
		s, err := m.cfg.Store.GetSecret(ctx, tenant, n)
		if err != nil {
			continue // deleted since: no longer given
		}
		v, err := m.cfg.Box.Open(s.Ciphertext, tenant+"/"+n)
		if err != nil {
			m.log.Error("secret does not open", "tenant", tenant, "name", n, "err", err)
			continue
		}
		c := egress.Credential{Name: n, Header: s.Header, Value: strings.ReplaceAll(s.Format, "{value}", string(v))}
		for _, h := range s.Hosts {
			if r, err := egress.ParseRule(h); err == nil {
				c.Hosts = append(c.Hosts, r)
			}
		}
		out = append(out, c)
	}
	return out
}
