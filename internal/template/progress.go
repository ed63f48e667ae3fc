package template

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Progress is what one build in progress in this process is doing.
type Progress struct {
	Name    string    // template being built
	Version string    // version being built (built-in templates); empty for built templates
	Started time.Time // when the build started
	Step    string    // what it is doing now, e.g. "installing remaining packages inside the chroot", "step 2/5: run make"
	Done    int       // units of work done: packages set up (base), steps finished (built templates)
	Total   int       // units of work known so far; 0 when unknown
	Line    string    // last line of output
}

// tracker is the live Progress of one build, registered in its Store while the build runs.
type tracker struct {
	s  *Store
	mu sync.Mutex
	p  Progress
}

func (s *Store) track(name, version string) *tracker {
	t := &tracker{s: s, p: Progress{Name: name, Version: version, Started: time.Now().UTC()}}
	s.mu.Lock()
	s.building[t] = struct{}{}
	s.mu.Unlock()
	return t
}

func (t *tracker) untrack() {
	t.s.mu.Lock()
	delete(t.s.building, t)
	t.s.mu.Unlock()
}

func (t *tracker) update(f func(p *Progress)) {
	t.mu.Lock()
	f(&t.p)
	t.mu.Unlock()
}

func (t *tracker) get() Progress {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.p
}

// Builds returns the builds running in this process (built-in templates being made by Ensure
// or Acquire, built templates between StartBuild and End), oldest first.
func (s *Store) Builds() []Progress {
	s.mu.Lock()
	ts := make([]*tracker, 0, len(s.building))
	for t := range s.building {
		ts = append(ts, t)
	}
	s.mu.Unlock()
	out := make([]Progress, 0, len(ts))
	for _, t := range ts {
		out = append(out, t.get())
	}
	slices.SortFunc(out, func(a, b Progress) int {
		if c := a.Started.Compare(b.Started); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	return out
}

// Build is one build of a user template (from build steps or an image), from StartBuild to End.
// While any Build (or Building) of this store runs, in this or another instance sharing UserDir,
// layers are not collected, so that layers being made, or found but not yet named by a template,
// stay. Its methods are safe for concurrent use.
type Build struct {
	s      *Store
	holder string
	t      *tracker
	unlock func()

	mu   sync.Mutex
	held []string
	done bool
}

// StartBuild begins a build of the user template name. holder is the holder under which the
// build references its parent (Parent), like a sandbox's: "<instance>/<build ID>", so that
// Reconcile drops it if the process dies mid-build. The caller must call End.
func (s *Store) StartBuild(ctx context.Context, name, holder string) (*Build, error) {
	if _, err := holderFile(holder); err != nil {
		return nil, err
	}
	unlock, err := s.buildLock(ctx)
	if err != nil {
		return nil, err
	}
	return &Build{s: s, holder: holder, t: s.track(name, ""), unlock: unlock}, nil
}

// Parent returns the template the build stands on, as Acquire with the build's holder: its
// layers stay until End, even if it is rebuilt or deleted meanwhile.
func (b *Build) Parent(ctx context.Context, name string) (Template, error) {
	t, err := b.s.Acquire(ctx, name, b.holder)
	if err != nil {
		return Template{}, err
	}
	b.mu.Lock()
	b.held = append(b.held, t.RootFS)
	b.held = append(b.held, t.Layers...)
	b.mu.Unlock()
	return t, nil
}

// Hold references more layers under the build's holder until End (an image layer the build
// unpacked and stands on, say).
func (b *Build) Hold(ctx context.Context, paths ...string) error {
	if err := b.s.Hold(ctx, b.holder, paths...); err != nil {
		return err
	}
	b.mu.Lock()
	b.held = append(b.held, paths...)
	b.mu.Unlock()
	return nil
}

// Step reports the step the build is at, done of total steps finished.
func (b *Build) Step(step string, done, total int) {
	b.t.update(func(p *Progress) { p.Step, p.Done, p.Total = step, done, total })
}

// Output reports the last line the build printed.
func (b *Build) Output(line string) {
	b.t.update(func(p *Progress) { p.Line = line })
}

// End finishes the build: it drops the build's references and its progress, and collects layers
// if a collection was put off while builds ran. Calling End again does nothing.
func (b *Build) End() {
	b.mu.Lock()
	if b.done {
		b.mu.Unlock()
		return
	}
	b.done = true
	held := b.held
	b.mu.Unlock()
	if len(held) > 0 {
		if err := b.s.Release(b.holder, held...); err != nil {
			b.s.log.Warn("release build references", "holder", b.holder, "err", err)
		}
	}
	b.t.untrack()
	b.unlock()
}

// Building marks a build in progress until the returned func is called, like StartBuild without
// a parent or progress.
func (s *Store) Building() func() {
	unlock, err := s.buildLock(context.Background())
	if err != nil {
		// Without the lock file, fall back to this process only: collection here waits.
		s.log.Warn("template build lock", "err", err)
		s.buildMu.RLock()
		return s.buildMu.RUnlock
	}
	return unlock
}

// buildLock takes <UserDir>/.builds.lock shared (and buildMu, for this process) until the
// returned func, which then runs a layer collection that was put off meanwhile.
func (s *Store) buildLock(ctx context.Context) (func(), error) {
	if err := mkdirDurable(filepath.Dir(s.userRoot), s.userRoot); err != nil {
		return nil, err
	}
	unlock, err := flockCtx(ctx, filepath.Join(s.userRoot, buildsLock), unix.LOCK_SH)
	if err != nil {
		return nil, err
	}
	s.buildMu.RLock()
	var once sync.Once
	return func() {
		once.Do(func() {
			s.buildMu.RUnlock()
			unlock()
			if s.layerGCPending.Load() {
				if err := s.collectLayers(context.Background(), nil); err != nil {
					s.log.Warn("collect template layers", "err", err)
				}
			}
		})
	}, nil
}

// tryBuildsExclusive takes the builds lock exclusively if no build runs in any instance sharing
// UserDir; nil means one does.
func (s *Store) tryBuildsExclusive() (func(), error) {
	if !s.buildMu.TryLock() {
		return nil, nil
	}
	unlock, err := tryLockFile(filepath.Join(s.userRoot, buildsLock))
	if err != nil || unlock == nil {
		s.buildMu.Unlock()
		return nil, err
	}
	return func() { unlock(); s.buildMu.Unlock() }, nil
}

// mmdebstrapProgress turns mmdebstrap's verbose output into the base build's Progress and into
// log lines: its own status lines ("I: ...", "W: ...", "E: ...") at their level, every line at
// debug level, and at most every interval (5 s if zero) a progress line at info level, so that
// the minutes of a first build are not silent. Step is the last "I:" phase ("downloading packages
// with apt", "installing remaining packages inside the chroot", ...); Total sums apt's "N newly
// installed" of each apt run (essential packages first, then the rest); Done counts dpkg's
// "Setting up" lines.
type mmdebstrapProgress struct {
	log      *slog.Logger
	t        *tracker
	interval time.Duration
	now      func() time.Time

	last    time.Time
	changed bool
}

func (p *mmdebstrapProgress) line(ctx context.Context, line string) {
	const prefix = "mmdebstrap: "
	now := time.Now
	if p.now != nil {
		now = p.now
	}
	interval := p.interval
	if interval == 0 {
		interval = 5 * time.Second
	}
	if p.last.IsZero() {
		p.last = now()
	}
	if len(line) > 2 && line[1] == ':' && strings.ContainsRune("IWE", rune(line[0])) {
		level := map[byte]slog.Level{'I': slog.LevelInfo, 'W': slog.LevelWarn, 'E': slog.LevelError}[line[0]]
		p.log.Log(ctx, level, prefix+line)
		if msg, ok := strings.CutSuffix(strings.TrimSpace(line[2:]), "..."); ok && line[0] == 'I' {
			p.t.update(func(pr *Progress) { pr.Step = msg })
		}
		return
	}
	p.log.DebugContext(ctx, prefix+line)
	var n int
	switch {
	case strings.HasPrefix(line, "Setting up "):
		p.t.update(func(pr *Progress) { pr.Done++; pr.Line = line })
		p.changed = true
	case strings.Contains(line, " newly installed") && parseNewlyInstalled(line, &n):
		p.t.update(func(pr *Progress) { pr.Total += n; pr.Line = line })
		p.changed = true
	default:
		p.t.update(func(pr *Progress) { pr.Line = line })
	}
	if p.changed && now().Sub(p.last) >= interval {
		p.last, p.changed = now(), false
		pr := p.t.get()
		p.log.InfoContext(ctx, fmt.Sprintf("%s%s: %d of %d packages set up", prefix, pr.Step, pr.Done, pr.Total))
	}
}

// parseNewlyInstalled reads N from apt's "U upgraded, N newly installed, ..." line.
func parseNewlyInstalled(line string, n *int) bool {
	_, rest, ok := strings.Cut(line, " upgraded, ")
	if !ok {
		return false
	}
	_, err := fmt.Sscanf(rest, "%d newly installed", n)
	return err == nil
}
