package api

import (
	"testing"

	"github.com/space-sandbox/space/internal/auth"
	"github.com/space-sandbox/space/internal/template/build"
)

// TestTemplateHostPathsAdminOnly: a template's image source on the host is shown to admins;
// tenants see only its kind.
func TestTemplateHostPathsAdminOnly(t *testing.T) {
	for _, tt := range []struct{ parent, tenant string }{
		{"docker-archive:/srv/images/app.tar", "docker-archive:"},
		{"oci:/srv/layouts/app", "oci:"},
		{"base", "base"},
		{"registry.example/app:1", "registry.example/app:1"},
	} {
		info := build.TemplateInfo{Name: "t", Parent: tt.parent}
		if got := toTemplateJSON(info, auth.Principal{Admin: true}).Parent; got != tt.parent {
			t.Errorf("admin sees %q, want %q", got, tt.parent)
		}
		if got := toTemplateJSON(info, auth.Principal{Tenant: "a"}).Parent; got != tt.tenant {
			t.Errorf("tenant sees %q, want %q", got, tt.tenant)
		}
	}
}
