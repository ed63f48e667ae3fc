package server

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/space-sandbox/space/internal/errdefs"
)

// User is one account of the sandbox's /etc/passwd.
type User struct {
	Name   string
	UID    uint32
	GID    uint32
	Home   string
	Shell  string
	Groups []uint32 // supplementary groups from /etc/group, primary group included
}

type group struct {
	name    string
	gid     uint32
	members []string
}

// parsePasswd reads passwd(5) lines (name:password:uid:gid:gecos:home:shell). Blank lines,
// comments, NIS (+/-) lines and malformed lines are skipped, as libc does.
func parsePasswd(r io.Reader) ([]User, error) {
	var out []User
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 4096), 1<<20)
	for sc.Scan() {
		line := strings.TrimRight(sc.Text(), "\r")
		if line == "" || line[0] == '#' || line[0] == '+' || line[0] == '-' {
			continue
		}
		f := strings.Split(line, ":")
		if len(f) < 7 || f[0] == "" {
			continue
		}
		uid, err1 := strconv.ParseUint(f[2], 10, 32)
		gid, err2 := strconv.ParseUint(f[3], 10, 32)
		if err1 != nil || err2 != nil {
			continue
		}
		out = append(out, User{Name: f[0], UID: uint32(uid), GID: uint32(gid), Home: f[5], Shell: f[6]})
	}
	if err := sc.Err(); err != nil {
		return out, fmt.Errorf("read passwd: %w", err)
	}
	return out, nil
}

// parseGroup reads group(5) lines (name:password:gid:member,member).
func parseGroup(r io.Reader) ([]group, error) {
	var out []group
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 4096), 1<<20)
	for sc.Scan() {
		line := strings.TrimRight(sc.Text(), "\r")
		if line == "" || line[0] == '#' || line[0] == '+' || line[0] == '-' {
			continue
		}
		f := strings.Split(line, ":")
		if len(f) < 4 || f[0] == "" {
			continue
		}
		gid, err := strconv.ParseUint(f[2], 10, 32)
		if err != nil {
			continue
		}
		g := group{name: f[0], gid: uint32(gid)}
		for m := range strings.SplitSeq(f[3], ",") {
			if m = strings.TrimSpace(m); m != "" {
				g.members = append(g.members, m)
			}
		}
		out = append(out, g)
	}
	if err := sc.Err(); err != nil {
		return out, fmt.Errorf("read group: %w", err)
	}
	return out, nil
}

// userDB is the sandbox's user database, re-read whenever a file changes (users may be added
// inside the sandbox after the agent started).
type userDB struct {
	passwdPath, groupPath string

	mu       sync.Mutex
	pwStamp  fileStamp
	grStamp  fileStamp
	users    []User
	groups   []group
	loadedAt time.Time
}

type fileStamp struct {
	mod  time.Time
	size int64
	ino  uint64
	ok   bool
}

func stampOf(path string) fileStamp {
	fi, err := os.Stat(path)
	if err != nil {
		return fileStamp{}
	}
	st := fileStamp{mod: fi.ModTime(), size: fi.Size(), ok: true}
	if sys, ok := fi.Sys().(interface{ Ino() uint64 }); ok {
		st.ino = sys.Ino()
	}
	return st
}

func newUserDB(passwdPath, groupPath string) *userDB {
	return &userDB{passwdPath: passwdPath, groupPath: groupPath}
}

func (d *userDB) refresh() {
	pw, gr := stampOf(d.passwdPath), stampOf(d.groupPath)
	if !d.loadedAt.IsZero() && pw == d.pwStamp && gr == d.grStamp {
		return
	}
	d.users, d.groups = nil, nil
	if b, err := os.ReadFile(d.passwdPath); err == nil {
		d.users, _ = parsePasswd(bytes.NewReader(b))
	}
	if b, err := os.ReadFile(d.groupPath); err == nil {
		d.groups, _ = parseGroup(bytes.NewReader(b))
	}
	d.pwStamp, d.grStamp, d.loadedAt = pw, gr, time.Now()
}

// lookup finds a user by name. An unknown name is errdefs.ErrInvalidArgument. Without any
// passwd entry for root, root still resolves to uid 0 with home /root.
func (d *userDB) lookup(name string) (User, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.refresh()
	for _, u := range d.users {
		if u.Name == name {
			u.Groups = d.groupsOfLocked(u)
			return u, nil
		}
	}
	if name == "root" {
		return User{Name: "root", Home: "/root", Shell: "/bin/sh", Groups: []uint32{0}}, nil
	}
	return User{}, errdefs.InvalidArgument(fmt.Sprintf("unknown user %q", name))
}

func (d *userDB) groupsOfLocked(u User) []uint32 {
	gids := []uint32{u.GID}
	for _, g := range d.groups {
		if g.gid == u.GID {
			continue
		}
		for _, m := range g.members {
			if m == u.Name {
				gids = append(gids, g.gid)
				break
			}
		}
	}
	return gids
}

// names returns the user and group names of uid and gid, or the numbers when unknown.
func (d *userDB) names(uid, gid uint32) (owner, grp string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.refresh()
	owner, grp = strconv.FormatUint(uint64(uid), 10), strconv.FormatUint(uint64(gid), 10)
	for _, u := range d.users {
		if u.UID == uid {
			owner = u.Name
			break
		}
	}
	for _, g := range d.groups {
		if g.gid == gid {
			grp = g.name
			break
		}
	}
	return owner, grp
}
