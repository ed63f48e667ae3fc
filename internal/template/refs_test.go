package template

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/space-sandbox/space/internal/errdefs"
)

// twoInstances returns two stores on one templates directory, each with its own UserDir, as two
// spaced instances sharing SPACE_TEMPLATES_DIR; both build minimal from busybox bb.
func twoInstances(t *testing.T, bb, bb2 string) (a, b *Store) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "templates")
	open := func(busybox, user string) *Store {
		s, err := New(Config{Dir: dir, UserDir: filepath.Join(t.TempDir(), user), Busybox: busybox})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	return open(bb, "a"), open(bb2, "b")
}

// changeBusybox appends bytes to a busybox copy: still valid, another recipe input.
func changeBusybox(t *testing.T, bb string) {
	t.Helper()
	f, err := os.OpenFile(bb, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("changed")
	f.Close()
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

func TestHeldVersionSurvivesRebuildByOtherInstance(t *testing.T) {
	ctx := t.Context()
	bb := hostBusybox(t)
	a, b := twoInstances(t, bb, bb)
	old, err := a.Acquire(ctx, "minimal", "a/sandbox-1")
	if err != nil {
		t.Fatal(err)
	}
	if h, err := a.Holders(old.RootFS); err != nil || !slices.Equal(h, []string{"a/sandbox-1"}) {
		t.Fatalf("Holders = %v, %v", h, err)
	}
	// The recipe's input changes and the other instance, which cannot see a's sandboxes, rebuilds.
	changeBusybox(t, bb)
	cur, err := b.Ensure(ctx, "minimal")
	if err != nil {
		t.Fatal(err)
	}
	if cur.Version == old.Version {
		t.Fatal("not rebuilt")
	}
	if err := b.GC(ctx); err != nil {
		t.Fatal(err)
	}
	if !exists(filepath.Join(old.RootFS, "bin/busybox")) {
		t.Fatal("a version held by another instance's sandbox was removed by a rebuild")
	}
	// Released: gone at the next collection, by either instance; the current one stays.
	if err := a.Release("a/sandbox-1", old.RootFS); err != nil {
		t.Fatal(err)
	}
	if err := a.Release("a/sandbox-1", old.RootFS); err != nil {
		t.Fatalf("second release: %v", err)
	}
	if err := b.GC(ctx); err != nil {
		t.Fatal(err)
	}
	if exists(filepath.Dir(old.RootFS)) {
		t.Error("released old version not removed by GC")
	}
	if diff := cmp.Diff([]string{cur.Version}, versions(t, b)); diff != "" {
		t.Errorf("versions (-want +got):\n%s", diff)
	}
	if exists(filepath.Join(b.dir, refsDir, "minimal", old.Version)) {
		t.Error("references directory of a removed version left behind")
	}
}

func TestHoldAndReleaseErrors(t *testing.T) {
	ctx := t.Context()
	s, _ := newStore(t, hostBusybox(t))
	tmpl, err := s.Ensure(ctx, "minimal")
	if err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(s.dir, "minimal", "0000000000000000", "rootfs")
	for _, c := range []struct {
		holder string
		paths  []string
		want   error
	}{
		{"", []string{tmpl.RootFS}, errdefs.ErrInvalidArgument},
		{"a/x", []string{"/etc"}, errdefs.ErrInvalidArgument},
		{"a/x", []string{filepath.Join(s.dir, "minimal")}, errdefs.ErrInvalidArgument},
		{"a/x", []string{tmpl.RootFS, missing}, errdefs.ErrNotFound},
	} {
		if err := s.Hold(ctx, c.holder, c.paths...); !errors.Is(err, c.want) {
			t.Errorf("Hold(%q, %v) = %v, want %v", c.holder, c.paths, err, c.want)
		}
	}
	// The failed Hold held nothing, not even the path that exists.
	if h, _ := s.Holders(tmpl.RootFS); len(h) != 0 {
		t.Errorf("failed Hold left references: %v", h)
	}
	// Holders that look like paths or hidden files are only names.
	odd := []string{"a/../../x", ".", "..", ".hidden", "a b%c"}
	for _, h := range odd {
		if err := s.Hold(ctx, h, tmpl.RootFS); err != nil {
			t.Fatalf("Hold(%q): %v", h, err)
		}
	}
	got, _ := s.Holders(tmpl.RootFS)
	slices.Sort(odd)
	if diff := cmp.Diff(odd, got); diff != "" {
		t.Errorf("holders (-want +got):\n%s", diff)
	}
	if err := s.Release("a/x", "/etc"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("Release of a foreign path: %v", err)
	}
}

func TestReconcileDropsOnlyDeadHoldersOfItsPrefix(t *testing.T) {
	ctx := t.Context()
	bb := hostBusybox(t)
	a, b := twoInstances(t, bb, bb)
	tmpl, err := a.Ensure(ctx, "minimal")
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{"a/live", "a/dead", "ab/dead", "b/dead"} {
		if err := a.Hold(ctx, h, tmpl.RootFS); err != nil {
			t.Fatal(err)
		}
	}
	var asked []string
	if err := a.Reconcile(ctx, "a/", func(h string) bool { asked = append(asked, h); return h == "a/live" }); err != nil {
		t.Fatal(err)
	}
	slices.Sort(asked)
	if diff := cmp.Diff([]string{"a/dead", "a/live"}, asked); diff != "" {
		t.Errorf("live asked about (-want +got):\n%s", diff)
	}
	got, _ := b.Holders(tmpl.RootFS)
	if diff := cmp.Diff([]string{"a/live", "ab/dead", "b/dead"}, got); diff != "" {
		t.Errorf("holders after Reconcile (-want +got):\n%s", diff)
	}
	if err := a.Reconcile(ctx, "", nil); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("empty prefix: %v", err)
	}
}

// TestAcquireRacesCollection runs two instances whose recipes differ (so each takes the other's
// version for an old one) acquiring and collecting at once: every template handed out must be
// complete until it is released.
func TestAcquireRacesCollection(t *testing.T) {
	ctx := t.Context()
	bb, bb2 := hostBusybox(t), hostBusybox(t)
	changeBusybox(t, bb2)
	a, b := twoInstances(t, bb, bb2)
	const rounds = 15
	var wg sync.WaitGroup
	errs := make(chan error, 4*rounds)
	for i, s := range []*Store{a, b, a, b} {
		wg.Go(func() {
			for r := range rounds {
				holder := fmt.Sprintf("%d/%d", i, r)
				tmpl, err := s.Acquire(ctx, "minimal", holder)
				if err != nil {
					errs <- err
					return
				}
				if !exists(filepath.Join(tmpl.RootFS, "bin/busybox")) || !exists(filepath.Join(filepath.Dir(tmpl.RootFS), metaFile)) {
					errs <- fmt.Errorf("round %d: Acquire handed out %s, which is gone", r, tmpl.RootFS)
				}
				if err := s.GC(ctx); err != nil {
					errs <- err
				}
				if !exists(filepath.Join(tmpl.RootFS, "bin/busybox")) {
					errs <- fmt.Errorf("round %d: held %s removed", r, tmpl.RootFS)
				}
				if err := s.Release(holder, tmpl.RootFS); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestAcquireLooksAgainWhenCollected has another instance collect the version Acquire found
// before Acquire references it: Acquire must not hand it out.
func TestAcquireLooksAgainWhenCollected(t *testing.T) {
	ctx := t.Context()
	bb, bb2 := hostBusybox(t), hostBusybox(t)
	changeBusybox(t, bb2)
	a, b := twoInstances(t, bb, bb2)
	first, err := a.Ensure(ctx, "minimal")
	if err != nil {
		t.Fatal(err)
	}
	collected := 0
	a.testHookAcquire = func(found Template) {
		if collected == 0 {
			if err := b.GC(ctx); err != nil {
				t.Error(err)
			}
			if exists(found.RootFS) {
				t.Error("the other instance did not collect the version (test broken)")
			}
		}
		collected++
	}
	tmpl, err := a.Acquire(ctx, "minimal", "a/sandbox-1")
	if err != nil {
		t.Fatal(err)
	}
	if collected != 2 || tmpl.Version != first.Version {
		t.Errorf("looked %d times, got version %s; want 2 and %s rebuilt", collected, tmpl.Version, first.Version)
	}
	if !exists(filepath.Join(tmpl.RootFS, "bin/busybox")) {
		t.Fatal("Acquire handed out a removed version")
	}
	if h, _ := a.Holders(tmpl.RootFS); !slices.Equal(h, []string{"a/sandbox-1"}) {
		t.Errorf("holders = %v", h)
	}
}

func TestHeldUserLayersSurvive(t *testing.T) {
	ctx := t.Context()
	bb := hostBusybox(t)
	s, err := New(Config{Dir: filepath.Join(t.TempDir(), "templates"), UserDir: filepath.Join(t.TempDir(), "user"), Busybox: bb})
	if err != nil {
		t.Fatal(err)
	}
	minimal, err := s.Ensure(ctx, "minimal")
	if err != nil {
		t.Fatal(err)
	}
	layer := func(key string) string {
		p, _, err := s.LayerPath(key)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(p, "f"), []byte(key), 0o644)
		return p
	}
	l1, l2 := layer("1111111111111111"), layer("2222222222222222")
	if _, err := s.Save(ctx, Template{Name: "app", RootFS: minimal.RootFS, Layers: []string{l1, l2}, Parent: "minimal"}); err != nil {
		t.Fatal(err)
	}
	// A sandbox stands on app; app's recipe changes upstream (minimal rebuilt) and app is deleted.
	sb, err := s.Acquire(ctx, "app", "a/sandbox-1")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{l1, l2}, sb.Layers); diff != "" {
		t.Fatalf("layers (-want +got):\n%s", diff)
	}
	changeBusybox(t, bb)
	if _, err := s.Ensure(ctx, "minimal"); err != nil {
		t.Fatal(err)
	}
	if !exists(filepath.Join(minimal.RootFS, "bin/busybox")) {
		t.Fatal("the version a built template stands on was removed by a rebuild")
	}
	// A build runs meanwhile: nothing is collected until it ends.
	build, err := s.StartBuild(ctx, "other", "a/build-1")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, "app", nil); err != nil {
		t.Fatal(err)
	}
	// Only the sandbox holds l1 and l2 now; drop its reference on l2.
	if err := s.Release("a/sandbox-1", l2); err != nil {
		t.Fatal(err)
	}
	if err := s.GC(ctx); err != nil {
		t.Fatal(err)
	}
	if !exists(l2) {
		t.Fatal("a layer was collected while a build ran")
	}
	build.End()
	if exists(l2) {
		t.Error("unreferenced layer of a deleted template kept after the build ended")
	}
	if !exists(filepath.Join(l1, "f")) || !exists(filepath.Join(sb.RootFS, "bin/busybox")) {
		t.Fatal("layers a sandbox holds were removed")
	}
	// The sandbox goes: everything it stood on is collected.
	if err := s.Release("a/sandbox-1", append([]string{sb.RootFS}, sb.Layers...)...); err != nil {
		t.Fatal(err)
	}
	if err := s.GC(ctx); err != nil {
		t.Fatal(err)
	}
	if exists(l1) || exists(filepath.Dir(sb.RootFS)) {
		t.Errorf("released layers kept: %s %v, %s %v", l1, exists(l1), sb.RootFS, exists(sb.RootFS))
	}
}

func TestBuildHoldsParentAndReportsProgress(t *testing.T) {
	ctx := t.Context()
	s, _ := newStore(t, hostBusybox(t))
	if _, err := s.StartBuild(ctx, "x", ""); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("StartBuild without a holder: %v", err)
	}
	b, err := s.StartBuild(ctx, "app", "a/build-7")
	if err != nil {
		t.Fatal(err)
	}
	parent, err := b.Parent(ctx, "minimal")
	if err != nil {
		t.Fatal(err)
	}
	if h, _ := s.Holders(parent.RootFS); !slices.Equal(h, []string{"a/build-7"}) {
		t.Errorf("parent holders = %v", h)
	}
	b.Step("step 2/3: run make", 1, 3)
	b.Output("cc -o app app.c")
	got := s.Builds()
	if len(got) != 1 || got[0].Started.IsZero() {
		t.Fatalf("Builds() = %+v", got)
	}
	got[0].Started = time.Time{}
	want := Progress{Name: "app", Step: "step 2/3: run make", Done: 1, Total: 3, Line: "cc -o app app.c"}
	if diff := cmp.Diff(want, got[0]); diff != "" {
		t.Errorf("progress (-want +got):\n%s", diff)
	}
	b.End()
	b.End()
	if h, _ := s.Holders(parent.RootFS); len(h) != 0 {
		t.Errorf("holders after End = %v", h)
	}
	if got := s.Builds(); len(got) != 0 {
		t.Errorf("Builds() after End = %+v", got)
	}
	// Building (the older form) still blocks collection until released.
	done := s.Building()
	done()
}

// Reconcile makes existing built templates hold their root filesystem (templates saved before
// references existed) and drops references of built templates that are gone.
func TestReconcileTemplateHolders(t *testing.T) {
	ctx := t.Context()
	s, _ := newStore(t, hostBusybox(t))
	minimal, err := s.Ensure(ctx, "minimal")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Save(ctx, Template{Name: "app", RootFS: minimal.RootFS, Parent: "minimal"}); err != nil {
		t.Fatal(err)
	}
	holder := s.templateHolder("app")
	if err := s.Release(holder, minimal.RootFS); err != nil {
		t.Fatal(err)
	}
	if err := s.Hold(ctx, s.templateHolder("gone"), minimal.RootFS); err != nil {
		t.Fatal(err)
	}
	if err := s.Reconcile(ctx, "a/", func(string) bool { return false }); err != nil {
		t.Fatal(err)
	}
	if h, _ := s.Holders(minimal.RootFS); !slices.Equal(h, []string{holder}) {
		t.Errorf("holders = %v, want [%s]", h, holder)
	}
}
