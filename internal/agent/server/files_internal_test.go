package server

import (
	"errors"
	"io/fs"
	"net/textproto"
	"path/filepath"
	"strings"
	"testing"

	"github.com/space-sandbox/space/internal/errdefs"
)

func TestPartNames(t *testing.T) {
	tests := []struct {
		disp     string
		form     string
		filename string
		ok       bool
	}{
		{`form-data; name="file"; filename="/home/user/a b.txt"`, "file", "/home/user/a b.txt", true},
		{`form-data; name="file"; filename="rel/dir/x.csv"`, "file", "rel/dir/x.csv", true},
		{`form-data; name="file"; filename*=UTF-8''%C3%A9t%C3%A9.txt`, "file", "été.txt", true},
		{`form-data; name="other"`, "other", "", true},
		{`attachment; filename="x"`, "", "", false},
		{`form-data; name="file"; filename="unterminated`, "", "", false},
		{``, "", "", false},
	}
	for _, tc := range tests {
		h := textproto.MIMEHeader{"Content-Disposition": {tc.disp}}
		form, filename, ok := partNames(h)
		if form != tc.form || filename != tc.filename || ok != tc.ok {
			t.Errorf("%q: got %q %q %v", tc.disp, form, filename, ok)
		}
	}
}

func TestResolvePath(t *testing.T) {
	u := User{Name: "user", Home: "/home/user"}
	tests := []struct {
		in, want string
		bad      bool
	}{
		{"/etc/passwd", "/etc/passwd", false},
		{"/a/../b//c/", "/b/c", false},
		{"file.txt", "/home/user/file.txt", false},
		{"../other", "/home/other", false},
		{"~", "/home/user", false},
		{"~/x/y", "/home/user/x/y", false},
		{"~other", "/home/user/~other", false},
		{"", "", true},
		{"a\x00b", "", true},
	}
	for _, tc := range tests {
		got, err := resolvePath(u, tc.in)
		if got != tc.want || (err != nil) != tc.bad {
			t.Errorf("resolvePath(%q) = %q, %v", tc.in, got, err)
		}
		if err != nil && !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("resolvePath(%q): class %v", tc.in, err)
		}
	}
}

// FuzzMultipartPath feeds arbitrary Content-Disposition headers through the path handling of
// POST /files: whatever a client sends, the target is absolute and clean, or rejected.
func FuzzMultipartPath(f *testing.F) {
	f.Add(`form-data; name="file"; filename="/home/user/a.txt"`, "")
	f.Add(`form-data; name="file"; filename="../../etc/shadow"`, "")
	f.Add(`form-data; name=file; filename*=UTF-8''%2Fetc%2Fx`, "/q")
	f.Add(`form-data; name="file"; filename="~/x"`, "")
	f.Fuzz(func(t *testing.T, disp, query string) {
		_, filename, ok := partNames(textproto.MIMEHeader{"Content-Disposition": {disp}})
		if !ok && filename != "" {
			t.Fatalf("rejected header returned filename %q", filename)
		}
		target := query
		if target == "" {
			target = filename
		}
		p, err := resolvePath(User{Home: "/home/user"}, target)
		if err != nil {
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("class %v", err)
			}
			return
		}
		if !filepath.IsAbs(p) || filepath.Clean(p) != p || strings.IndexByte(p, 0) >= 0 {
			t.Fatalf("target %q from %q is not absolute and clean", p, target)
		}
	})
}

func TestParseMode(t *testing.T) {
	tests := []struct {
		in   string
		mode fs.FileMode
		set  bool
		bad  bool
	}{
		{"", 0, false, false},
		{"0644", 0o644, true, false},
		{"755", 0o755, true, false},
		{"4755", 0o755 | fs.ModeSetuid, true, false},
		{"1777", 0o777 | fs.ModeSticky, true, false},
		{"0", 0, true, false},
		{"8", 0, false, true},
		{"17777", 0, false, true},
		{"-1", 0, false, true},
		{"rw", 0, false, true},
	}
	for _, tc := range tests {
		m, set, err := parseMode(tc.in)
		if m != tc.mode || set != tc.set || (err != nil) != tc.bad {
			t.Errorf("parseMode(%q) = %v %v %v", tc.in, m, set, err)
		}
	}
}

func TestPermString(t *testing.T) {
	tests := []struct {
		mode uint32
		want string
	}{
		{0o100644, "-rw-r--r--"},
		{0o040755, "drwxr-xr-x"},
		{0o041777, "drwxrwxrwt"},
		{0o041776, "drwxrwxrwT"},
		{0o120777, "lrwxrwxrwx"},
		{0o104755, "-rwsr-xr-x"},
		{0o102644, "-rw-r-Sr--"},
		{0o010600, "prw-------"},
		{0o140755, "srwxr-xr-x"},
		{0o020666, "crw-rw-rw-"},
		{0o060660, "brw-rw----"},
	}
	for _, tc := range tests {
		if got := permString(tc.mode); got != tc.want {
			t.Errorf("permString(%o) = %q, want %q", tc.mode, got, tc.want)
		}
	}
}
