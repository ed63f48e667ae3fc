package network

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/space-sandbox/space/internal/errdefs"
)

// Address leases. Slot index i of every spaced instance on the host means the i-th /30 of the
// CIDR, so instances sharing a lease directory coordinate through it: file <LeaseDir>/<i> exists
// while some instance holds index i. It holds two lines, the owner's instance id and the slot's
// state (leasePool: prepared, leaseUsed: handed out), which is how a restarted instance tells
// the slots it must keep for Adopt from leftovers.
//
// A lease is taken by writing a temporary file and hard-linking it to <i>: link(2) fails with
// EEXIST exactly like open(O_CREAT|O_EXCL), and the lease never exists without its content (a
// crash leaves at most a temporary file, which the owner's next start removes). Leases are not
// fsynced: they describe netns and veths, which do not survive a reboot either.

type leaseState string

const (
	leasePool leaseState = "pool"
	leaseUsed leaseState = "used"
)

type lease struct {
	owner string
	state leaseState
}

func leaseContent(inst string, st leaseState) []byte {
	return []byte(inst + "\n" + string(st) + "\n")
}

func parseLease(b []byte) (lease, error) {
	owner, rest, _ := strings.Cut(string(b), "\n")
	st, _, _ := strings.Cut(rest, "\n")
	if !instanceRE.MatchString(owner) {
		return lease{}, fmt.Errorf("bad lease owner %q", owner)
	}
	return lease{owner: owner, state: leaseState(st)}, nil
}

func leasePath(dir string, i int) string { return filepath.Join(dir, strconv.Itoa(i)) }

// tmpPrefix starts the names of an instance's temporary files in the lease directory.
func tmpPrefix(inst string) string { return "." + inst + "." }

// writeTemp writes content to a new temporary file of inst in dir and returns its path.
func writeTemp(dir, inst string, content []byte) (string, error) {
	f, err := os.CreateTemp(dir, tmpPrefix(inst)+"*.tmp")
	if err != nil {
		return "", err
	}
	_, err = f.Write(content)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(f.Name())
		return "", err
	}
	return f.Name(), nil
}

// takeLease takes the first free index in [start, n) then [0, start), as leasePool of inst.
// It fails with an error wrapping errdefs.ErrResourceExhausted if every index is taken.
func takeLease(dir, inst string, start, n int) (int, error) {
	tmp, err := writeTemp(dir, inst, leaseContent(inst, leasePool))
	if err != nil {
		return 0, fmt.Errorf("take lease: %w", err)
	}
	defer os.Remove(tmp)
	for k := range n {
		i := (start + k) % n
		err := os.Link(tmp, leasePath(dir, i))
		if err == nil {
			return i, nil
		}
		if !errors.Is(err, fs.ErrExist) {
			return 0, fmt.Errorf("take lease %d: %w", i, err)
		}
	}
	return 0, fmt.Errorf("all %d addresses are leased: %w", n, errdefs.ErrResourceExhausted)
}

// setLeaseState atomically rewrites lease i, which inst holds, with state st.
func setLeaseState(dir, inst string, i int, st leaseState) error {
	tmp, err := writeTemp(dir, inst, leaseContent(inst, st))
	if err != nil {
		return fmt.Errorf("update lease %d: %w", i, err)
	}
	if err := os.Rename(tmp, leasePath(dir, i)); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("update lease %d: %w", i, err)
	}
	return nil
}

// readLease reads lease i; the error wraps fs.ErrNotExist if it is free.
func readLease(dir string, i int) (lease, error) {
	b, err := os.ReadFile(leasePath(dir, i))
	if err != nil {
		return lease{}, err
	}
	l, err := parseLease(b)
	if err != nil {
		return lease{}, fmt.Errorf("lease %d: %w", i, err)
	}
	return l, nil
}

// dropLease removes lease i if inst holds it.
func dropLease(dir, inst string, i int) error {
	l, err := readLease(dir, i)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if l.owner != inst {
		return nil
	}
	if err := os.Remove(leasePath(dir, i)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("drop lease %d: %w", i, err)
	}
	return nil
}
