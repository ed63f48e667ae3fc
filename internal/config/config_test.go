package config

import (
	"strings"
	"testing"
	"time"
)

func TestLoad(t *testing.T) {
	envOf := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		wantErr string
		check   func(t *testing.T, c Config)
	}{
		{name: "defaults", check: func(t *testing.T, c Config) {
			if c.Listen != "127.0.0.1:7070" || c.DefaultEgress != "deny" || len(c.Instance) != 4 {
				t.Errorf("got %+v", c)
			}
		}},
		{name: "env", env: map[string]string{"SPACE_HOME": "/tmp/h1", "SPACE_LISTEN": "127.0.0.1:9"}, check: func(t *testing.T, c Config) {
			if c.Home != "/tmp/h1" || c.Listen != "127.0.0.1:9" {
				t.Errorf("got %+v", c)
			}
		}},
		{name: "flag beats env", args: []string{"-listen", "127.0.0.1:8"}, env: map[string]string{"SPACE_LISTEN": "127.0.0.1:9"}, check: func(t *testing.T, c Config) {
			if c.Listen != "127.0.0.1:8" {
				t.Errorf("listen %s", c.Listen)
			}
		}},
		{name: "homes give different instances", env: map[string]string{"SPACE_HOME": "/tmp/a"}, check: func(t *testing.T, c Config) {
			other, err := Load(nil, envOf(map[string]string{"SPACE_HOME": "/tmp/b"}))
			if err != nil || other.Instance == c.Instance {
				t.Errorf("instances %s %s err %v", c.Instance, other.Instance, err)
			}
		}},
		{name: "bad listen", env: map[string]string{"SPACE_LISTEN": "nope"}, wantErr: "listen"},
		{name: "bad egress", env: map[string]string{"SPACE_DEFAULT_EGRESS": "maybe"}, wantErr: "default egress"},
		{name: "bad dns", env: map[string]string{"SPACE_EGRESS_DNS": "8.8.8.8"}, wantErr: "egress dns"},
		{name: "egress limits", env: map[string]string{"SPACE_EGRESS_MAX_CONNS": "32", "SPACE_EGRESS_IDLE": "90s"}, check: func(t *testing.T, c Config) {
			if c.EgressMaxConns != 32 || c.EgressIdle != 90*time.Second || c.EgressConnRate != 100 || c.EgressDNSRate != 50 {
				t.Errorf("egress limits: %d %s %d %d", c.EgressMaxConns, c.EgressIdle, c.EgressConnRate, c.EgressDNSRate)
			}
		}},
		{name: "bad egress idle", env: map[string]string{"SPACE_EGRESS_IDLE": "soon"}, wantErr: "SPACE_EGRESS_IDLE"},
		{name: "zero egress conns", env: map[string]string{"SPACE_EGRESS_MAX_CONNS": "-1"}, wantErr: "egress limits"},
		{name: "bad instance", env: map[string]string{"SPACE_INSTANCE": "XYZ"}, wantErr: "instance"},
		{name: "bad cidr", env: map[string]string{"SPACE_SLOT_CIDR": "10.0.0.0/30"}, wantErr: "slot cidr"},
		{name: "extra args", args: []string{"x"}, wantErr: "unexpected"},
		{name: "warm pool templates default", check: func(t *testing.T, c Config) {
			if len(c.WarmTemplates) != 1 || c.WarmTemplates["code-interpreter"] != 1 {
				t.Errorf("warm templates %v", c.WarmTemplates)
			}
		}},
		{name: "warm pool templates", env: map[string]string{"SPACE_WARM_POOL_TEMPLATES": " code-interpreter=3, mine=0 "}, check: func(t *testing.T, c Config) {
			if len(c.WarmTemplates) != 2 || c.WarmTemplates["code-interpreter"] != 3 || c.WarmTemplates["mine"] != 0 {
				t.Errorf("warm templates %v", c.WarmTemplates)
			}
		}},
		{name: "warm pool templates none", env: map[string]string{"SPACE_WARM_POOL_TEMPLATES": "none"}, check: func(t *testing.T, c Config) {
			if len(c.WarmTemplates) != 0 {
				t.Errorf("warm templates %v", c.WarmTemplates)
			}
		}},
		{name: "bad warm pool templates", env: map[string]string{"SPACE_WARM_POOL_TEMPLATES": "code-interpreter=65"}, wantErr: "warm pool templates"},
		{name: "bad warm pool template name", env: map[string]string{"SPACE_WARM_POOL_TEMPLATES": "../x=1"}, wantErr: "warm pool templates"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Load(tt.args, envOf(tt.env))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, c)
		})
	}
}
