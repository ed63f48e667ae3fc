package server

import (
	"encoding/binary"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"
)

func inotifyRecord(wd int32, mask, cookie uint32, name string, pad int) []byte {
	n := len(name)
	if name != "" {
		n += pad
	}
	b := make([]byte, unix.SizeofInotifyEvent+n)
	binary.NativeEndian.PutUint32(b[0:], uint32(wd))
	binary.NativeEndian.PutUint32(b[4:], mask)
	binary.NativeEndian.PutUint32(b[8:], cookie)
	binary.NativeEndian.PutUint32(b[12:], uint32(n))
	copy(b[16:], name)
	return b
}

func TestParseInotify(t *testing.T) {
	buf := append(inotifyRecord(1, unix.IN_CREATE, 0, "a.txt", 11), inotifyRecord(2, unix.IN_DELETE_SELF, 0, "", 0)...)
	buf = append(buf, inotifyRecord(3, unix.IN_MOVED_FROM, 7, "exactly16bytes!!", 0)...)
	got, err := parseInotify(buf)
	if err != nil {
		t.Fatal(err)
	}
	want := []rawInotify{
		{wd: 1, mask: unix.IN_CREATE, name: "a.txt"},
		{wd: 2, mask: unix.IN_DELETE_SELF},
		{wd: 3, mask: unix.IN_MOVED_FROM, cookie: 7, name: "exactly16bytes!!"},
	}
	if diff := cmp.Diff(want, got, cmp.AllowUnexported(rawInotify{})); diff != "" {
		t.Fatalf("(-want +got):\n%s", diff)
	}

	trunc := inotifyRecord(1, unix.IN_CREATE, 0, "name", 12)
	if got, err := parseInotify(trunc[:len(trunc)-1]); err == nil || len(got) != 0 {
		t.Fatalf("truncated name: %v %v", got, err)
	}
	if got, err := parseInotify(append(inotifyRecord(1, unix.IN_MODIFY, 0, "x", 3), 1, 2, 3)); err == nil || len(got) != 1 {
		t.Fatalf("truncated header: %v %v", got, err)
	}
}

func FuzzParseInotify(f *testing.F) {
	f.Add(inotifyRecord(1, unix.IN_CREATE, 0, "a.txt", 11))
	f.Add(append(inotifyRecord(1, unix.IN_CREATE, 0, "", 0), 0xff, 0xff))
	f.Fuzz(func(t *testing.T, b []byte) {
		recs, _ := parseInotify(b)
		total := 0
		for _, r := range recs {
			total += unix.SizeofInotifyEvent + len(r.name)
			for i := 0; i < len(r.name); i++ {
				if r.name[i] == 0 {
					t.Fatalf("name %q holds a NUL", r.name)
				}
			}
		}
		if total > len(b) {
			t.Fatalf("records span %d bytes of %d", total, len(b))
		}
	})
}
