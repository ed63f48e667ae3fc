package server

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/space-sandbox/space/internal/errdefs"
)

func TestParsePasswd(t *testing.T) {
	in := strings.Join([]string{
		"root:x:0:0:root:/root:/bin/bash",
		"# a comment",
		"",
		"daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin",
		"+nisuser::::::",
		"broken:x:notanumber:1::/:/bin/sh",
		"short:x:5:5",
		":x:6:6::/:/bin/sh",
		"user:x:1000:1000:A User,,,:/home/user:/bin/bash\r",
		"colon:x:1001:1001:gecos:/home/colon:/bin/sh:extra",
	}, "\n")
	got, err := parsePasswd(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	want := []User{
		{Name: "root", UID: 0, GID: 0, Home: "/root", Shell: "/bin/bash"},
		{Name: "daemon", UID: 1, GID: 1, Home: "/usr/sbin", Shell: "/usr/sbin/nologin"},
		{Name: "user", UID: 1000, GID: 1000, Home: "/home/user", Shell: "/bin/bash"},
		{Name: "colon", UID: 1001, GID: 1001, Home: "/home/colon", Shell: "/bin/sh"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("(-want +got):\n%s", diff)
	}
}

func TestUserDB(t *testing.T) {
	dir := t.TempDir()
	pw, gr := filepath.Join(dir, "passwd"), filepath.Join(dir, "group")
	write := func(p, s string) {
		t.Helper()
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(pw, "root:x:0:0::/root:/bin/sh\nuser:x:1000:100::/home/user:/bin/sh\n")
	write(gr, "root:x:0:\nusers:x:100:\ndocker:x:999:user,other\nwheel:x:10:other\n")
	db := newUserDB(pw, gr)

	u, err := db.lookup("user")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(User{Name: "user", UID: 1000, GID: 100, Home: "/home/user", Shell: "/bin/sh", Groups: []uint32{100, 999}}, u); diff != "" {
		t.Errorf("user (-want +got):\n%s", diff)
	}
	if _, err := db.lookup("nobody"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("unknown user: %v", err)
	}
	if o, g := db.names(1000, 999); o != "user" || g != "docker" {
		t.Errorf("names = %s %s", o, g)
	}
	if o, g := db.names(4242, 4243); o != "4242" || g != "4243" {
		t.Errorf("unknown ids = %s %s", o, g)
	}

	// A user added later (useradd inside the sandbox) is seen without a restart.
	time.Sleep(10 * time.Millisecond)
	write(pw, "root:x:0:0::/root:/bin/sh\nuser:x:1000:100::/home/user:/bin/sh\nnewbie:x:1002:100::/home/newbie:/bin/sh\n")
	if u, err := db.lookup("newbie"); err != nil || u.UID != 1002 {
		t.Errorf("new user: %+v %v", u, err)
	}

	// Without any database, root still resolves.
	empty := newUserDB(filepath.Join(dir, "none"), filepath.Join(dir, "none"))
	if u, err := empty.lookup("root"); err != nil || u.UID != 0 || u.Home != "/root" {
		t.Errorf("fallback root: %+v %v", u, err)
	}
}

func FuzzParsePasswd(f *testing.F) {
	f.Add("root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000::/home/user:/bin/sh\n")
	f.Add("a:b:c:d:e:f:g")
	f.Add("::::::\n#\n+\n-x\n")
	f.Add("x:x:4294967295:4294967296::/:/\n")
	f.Fuzz(func(t *testing.T, s string) {
		users, _ := parsePasswd(strings.NewReader(s))
		for _, u := range users {
			if u.Name == "" || strings.ContainsAny(u.Name, ":\n") {
				t.Fatalf("bad name %q", u.Name)
			}
			if strings.ContainsAny(u.Home, ":\n") {
				t.Fatalf("bad home %q", u.Home)
			}
		}
		groups, _ := parseGroup(strings.NewReader(s))
		for _, g := range groups {
			for _, m := range g.members {
				if m == "" || strings.ContainsAny(m, ",:\n") {
					t.Fatalf("bad member %q", m)
				}
			}
		}
	})
}

func TestBasicAuthUser(t *testing.T) {
	tests := []struct {
		header string
		user   string
		ok     bool
		bad    bool
	}{
		{"", "", false, false},
		{"Bearer abc", "", false, false},
		{"Basic cm9vdDo=", "root", true, false},     // "root:"
		{"basic dXNlcjpwYXNz", "user", true, false}, // "user:pass"
		{"Basic   dXNlcjo=  ", "user", true, false},
		{"Basic !!!", "", true, true},
		{"Basic Og==", "", true, true}, // ":"
	}
	for _, tc := range tests {
		user, ok, err := basicAuthUser(tc.header)
		if user != tc.user || ok != tc.ok || (err != nil) != tc.bad {
			t.Errorf("%q: got %q %v %v", tc.header, user, ok, err)
		}
		if err != nil && !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%q: error class %v", tc.header, err)
		}
	}
}

func FuzzBasicAuthUser(f *testing.F) {
	f.Add("Basic cm9vdDo=")
	f.Add("Basic ")
	f.Add("basic Og==")
	f.Fuzz(func(t *testing.T, h string) {
		user, ok, err := basicAuthUser(h)
		if err == nil && ok && (user == "" || strings.Contains(user, ":")) {
			t.Fatalf("%q: user %q", h, user)
		}
		if !ok && (user != "" || err != nil) {
			t.Fatalf("%q: not basic but %q %v", h, user, err)
		}
	})
}

func TestTokenOK(t *testing.T) {
	tests := []struct {
		want, got string
		ok        bool
	}{
		{"", "", true}, {"", "anything", true}, {"abc", "abc", true},
		{"abc", "", false}, {"abc", "ab", false}, {"abc", "abcd", false}, {"abc", "ABC", false},
	}
	for _, tc := range tests {
		if got := tokenOK(tc.want, tc.got); got != tc.ok {
			t.Errorf("tokenOK(%q, %q) = %v", tc.want, tc.got, got)
		}
	}
}
