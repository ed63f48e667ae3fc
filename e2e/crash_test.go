package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/crashpoint"
	"github.com/space-sandbox/space/internal/spacedtest"
	"github.com/space-sandbox/space/pkg/client"
)

// crashVictim is a sandbox an operation acts on when spaced dies: what it held before.
type crashVictim struct {
	id   string
	pid  int    // a background process
	file string // content of /root/file
	snap string // a snapshot taken for the case, if any
}

// crashCase is one crash point: what to set up, the operation that reaches the point, and what
// must hold after the restart.
type crashCase struct {
	setup func(t *testing.T, c *client.Client) *crashVictim
	op    func(ctx context.Context, c *client.Client, v *crashVictim) error
	check func(t *testing.T, c *client.Client, v *crashVictim)
}

// TestCrashPoints kills spaced (SIGKILL, by itself: SPACE_CRASH_AT) at every step of every
// operation (internal/crashpoint), restarts it on the same home and checks that nothing was lost
// or stranded: sandboxes that were running run on with the same processes (or, if their runtime
// truly died, come back from their latest full snapshot), an acknowledged pause resumes, an
// operation that was not acknowledged either happened whole or not at all, no sandbox is left in
// a transitional state, no snapshot is half there, and no scratch, runtime, mount, netns or cgroup
// is left over. Two bystanders, one running and one paused, live through every crash of the run.
func TestCrashPoints(t *testing.T) {
	d := startSpaced(t, "SPACE_WARM_POOL=0")
	c := d.Client
	ctx := ctxT(t)
	// A crash in the middle of the first build of base (which spaced starts by itself) would
	// only make every restart begin it again: wait for it, as every later test needs it anyway.
	waitTemplate(t, c, "base")
	runner := crashVictimNew(t, c, "runner")
	sleeper := crashVictimNew(t, c, "sleeper")
	if _, err := c.PauseSandbox(ctx, sleeper.id); err != nil {
		t.Fatal(err)
	}
	bystanders := []string{runner.id, sleeper.id}
	baseEnv := d.Opts.Env
	cases := crashCases(t, bystanders)
	for _, point := range crashpoint.All() {
		cc, ok := cases[point]
		if !ok {
			t.Errorf("crash point %s has no case: every step must be visited", point)
			continue
		}
		t.Run(point, func(t *testing.T) {
			ctx := ctxT(t)
			var v *crashVictim
			if cc.setup != nil {
				v = cc.setup(t, c)
			}
			if err := d.Stop(); err != nil {
				t.Fatalf("stop spaced: %v", err)
			}
			d.Opts.Env = append(slices.Clip(baseEnv), "SPACE_CRASH_AT="+point)
			startErr := d.Restart(ctx)
			if point == crashpoint.RecoverAdopting {
				if startErr == nil {
					t.Fatal("spaced served although recovery was to crash")
				}
			} else {
				if startErr != nil {
					t.Fatal(startErr)
				}
				done := make(chan error, 1)
				go func() { done <- cc.op(ctx, c, v) }()
				ps, err := d.WaitExit(3 * time.Minute)
				if err != nil {
					t.Fatalf("%v: the operation did not reach %s (operation: %v)", err, point, <-done)
				}
				if opErr := <-done; opErr == nil {
					t.Errorf("the operation was acknowledged although spaced died at %s (%v)", point, ps)
				}
			}
			if !strings.Contains(d.Log(), "point="+point+"\n") {
				t.Fatalf("spaced did not die at %s:\n%s", point, tail(d.Log(), 30))
			}
			d.Opts.Env = baseEnv
			if err := d.Restart(ctx); err != nil {
				t.Fatalf("restart after the crash: %v", err)
			}
			crashSettled(t, d)
			expectKept(t, c, runner.id, "/root/file", runner.file, runner.pid, "bystander after "+point)
			crashPausedKept(t, c, sleeper)
			if cc.check != nil {
				cc.check(t, c, v)
			}
			crashNoStrays(t, d)
			if v != nil && v.id != "" {
				if err := c.DeleteSandbox(ctx, v.id); err != nil && !isNotFound(err) {
					t.Errorf("delete victim: %v", err)
				}
				if v.snap != "" {
					if err := c.DeleteSnapshot(ctx, v.snap); err != nil && !isNotFound(err) {
						t.Errorf("delete snapshot: %v", err)
					}
				}
			}
			crashOnly(t, c, bystanders)
		})
	}
}

// waitTemplate waits (up to 15 minutes: a first build of base) until template name is built.
func waitTemplate(t *testing.T, c *client.Client, name string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Minute)
	for {
		tpls, err := c.ListTemplates(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		for _, tp := range tpls {
			if tp.Name == name {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("template %s not built within 15 minutes", name)
		}
		time.Sleep(time.Second)
	}
}

func crashCases(t *testing.T, bystanders []string) map[string]crashCase {
	victim := func(t *testing.T, c *client.Client) *crashVictim { return crashVictimNew(t, c, "victim") }
	withSnap := func(kind string) func(t *testing.T, c *client.Client) *crashVictim {
		return func(t *testing.T, c *client.Client) *crashVictim {
			v := crashVictimNew(t, c, "before")
			s, err := c.CreateSnapshot(ctxT(t), v.id, kind, "")
			if err != nil {
				t.Fatal(err)
			}
			v.snap = s.ID
			run(t, c, v.id, "echo after > /root/file")
			return v
		}
	}
	noNewSandbox := func(t *testing.T, c *client.Client, _ *crashVictim) { crashOnly(t, c, bystanders) }
	mkSandbox := func(ctx context.Context, c *client.Client, _ *crashVictim) error {
		_, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Template: "minimal"})
		return err
	}
	pause := func(ctx context.Context, c *client.Client, v *crashVictim) error {
		_, err := c.PauseSandbox(ctx, v.id)
		return err
	}
	paused := func(ctx context.Context, c *client.Client, v *crashVictim) error {
		if _, err := c.PauseSandbox(ctx, v.id); err != nil {
			return fmt.Errorf("set-up pause (before the crash point): %w", err)
		}
		_, err := c.ResumeSandbox(ctx, v.id)
		return err
	}
	// kept: the victim runs (or is paused, and resumes) with its file and process.
	kept := func(t *testing.T, c *client.Client, v *crashVictim) { crashRunsOrResumes(t, c, v, v.file) }
	snapshot := func(kind string) func(ctx context.Context, c *client.Client, v *crashVictim) error {
		return func(ctx context.Context, c *client.Client, v *crashVictim) error {
			_, err := c.CreateSnapshot(ctx, v.id, kind, "")
			return err
		}
	}
	snapKept := func(t *testing.T, c *client.Client, v *crashVictim) {
		kept(t, c, v)
		crashSnapshotsWhole(t, c, v)
	}
	fork := func(ctx context.Context, c *client.Client, v *crashVictim) error {
		_, err := c.ForkSandbox(ctx, v.id, 2)
		return err
	}
	forkKept := func(t *testing.T, c *client.Client, v *crashVictim) {
		kept(t, c, v)
		crashOnly(t, c, append(slices.Clip(bystanders), v.id))
	}
	del := func(ctx context.Context, c *client.Client, v *crashVictim) error {
		return c.DeleteSandbox(ctx, v.id)
	}
	gone := func(t *testing.T, c *client.Client, v *crashVictim) {
		if sb, err := c.GetSandbox(ctxT(t), v.id); !isNotFound(err) {
			t.Errorf("a sandbox whose delete was under way is %+v, %v: want it gone", sb, err)
		}
		crashOnly(t, c, bystanders)
	}
	build := func(ctx context.Context, c *client.Client, _ *crashVictim) error {
		_, err := c.BuildTemplate(ctx, client.BuildTemplateRequest{Name: "crashbuild", From: client.BuildFrom{Template: "minimal"},
			Steps: []client.BuildStep{{Run: "echo built > /built"}}}, nil)
		return err
	}
	built := func(t *testing.T, c *client.Client, _ *crashVictim) {
		ctx := ctxT(t)
		crashOnly(t, c, bystanders) // no build sandbox left behind
		if _, err := c.BuildTemplate(ctx, client.BuildTemplateRequest{Name: "crashbuild", From: client.BuildFrom{Template: "minimal"},
			Steps: []client.BuildStep{{Run: "echo built > /built"}}}, nil); err != nil {
			t.Fatalf("build again after the crash: %v", err)
		}
		sb := create(t, c, client.CreateSandboxRequest{Template: "crashbuild"})
		if res := run(t, c, sb.ID, "cat /built"); res.Stdout != "built\n" {
			t.Errorf("template built after the crash holds %+v", res)
		}
		if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
			t.Error(err)
		}
		if err := c.DeleteTemplate(ctx, "crashbuild"); err != nil {
			t.Error(err)
		}
	}
	return map[string]crashCase{
		crashpoint.CreateRecorded:  {op: mkSandbox, check: noNewSandbox},
		crashpoint.CreateStarted:   {op: mkSandbox, check: noNewSandbox},
		crashpoint.PausePausing:    {setup: victim, op: pause, check: kept},
		crashpoint.PauseCheckpoint: {setup: victim, op: pause, check: kept},
		crashpoint.PauseMarked:     {setup: victim, op: pause, check: kept},
		crashpoint.PauseStopped:    {setup: victim, op: pause, check: kept},
		crashpoint.ResumeResuming:  {setup: victim, op: paused, check: kept},
		crashpoint.ResumeRestored:  {setup: victim, op: paused, check: kept},
		crashpoint.ResumeRunning:   {setup: victim, op: paused, check: kept},
		crashpoint.ForkCheckpoint:  {setup: victim, op: fork, check: forkKept},
		crashpoint.ForkCopy:        {setup: victim, op: fork, check: forkKept},
		crashpoint.SnapFrozen:      {setup: victim, op: snapshot("filesystem"), check: snapKept},
		crashpoint.SnapFullFrozen:  {setup: victim, op: snapshot("full"), check: snapKept},
		crashpoint.SnapStored:      {setup: victim, op: snapshot("filesystem"), check: snapKept},
		crashpoint.RestorePaths: {setup: withSnap("filesystem"),
			op: func(ctx context.Context, c *client.Client, v *crashVictim) error {
				_, err := c.Restore(ctx, v.id, v.snap, "/root/file")
				return err
			},
			check: func(t *testing.T, c *client.Client, v *crashVictim) {
				// Files are restored in place while processes run: the file is the old or the new
				// one, whole, and the process lives on.
				crashRunsOrResumes(t, c, v, "")
				if res := run(t, c, v.id, "cat /root/file"); res.Stdout != "after\n" && res.Stdout != v.file {
					t.Errorf("file half restored: %q", res.Stdout)
				}
			}},
		crashpoint.RestoreWhole: {setup: withSnap("full"),
			op: func(ctx context.Context, c *client.Client, v *crashVictim) error {
				_, err := c.Restore(ctx, v.id, v.snap)
				return err
			},
			check: func(t *testing.T, c *client.Client, v *crashVictim) {
				// The old runtime was gone: the sandbox is the snapshot's, processes included.
				crashRunsOrResumes(t, c, v, v.file)
			}},
		crashpoint.DeleteDeleting:  {setup: victim, op: del, check: gone},
		crashpoint.DeleteTornDown:  {setup: victim, op: del, check: gone},
		crashpoint.BuildStarted:    {op: build, check: built},
		crashpoint.BuildLayer:      {op: build, check: built},
		crashpoint.RecoverAdopting: {},
	}
}

func crashVictimNew(t *testing.T, c *client.Client, content string) *crashVictim {
	t.Helper()
	ctx := ctxT(t)
	sb := create(t, c, client.CreateSandboxRequest{Template: "minimal"})
	run(t, c, sb.ID, "echo "+content+" > /root/file")
	pid, err := c.ExecBackground(ctx, sb.ID, client.ExecRequest{Command: "sleep 3600"})
	if err != nil {
		t.Fatal(err)
	}
	return &crashVictim{id: sb.ID, pid: pid, file: content + "\n"}
}

// crashRunsOrResumes: v is running, or paused and resumes, with its process and (unless want is
// empty) its file.
func crashRunsOrResumes(t *testing.T, c *client.Client, v *crashVictim, want string) {
	t.Helper()
	ctx := ctxT(t)
	sb, err := c.GetSandbox(ctx, v.id)
	if err != nil {
		t.Fatalf("victim after the crash: %v", err)
	}
	switch sb.State {
	case client.StatePaused:
		if _, err := c.ResumeSandbox(ctx, v.id); err != nil {
			t.Fatalf("resume the victim after the crash: %v", err)
		}
	case client.StateRunning:
	default:
		t.Fatalf("victim after the crash is %s: want running or paused", sb.State)
	}
	if want == "" {
		procs, err := c.ListProcesses(ctx, v.id)
		if err != nil {
			t.Fatal(err)
		}
		if p := findProc(procs, v.pid); p == nil || !p.Running {
			t.Fatalf("victim's process %d gone after the crash: %+v", v.pid, procs)
		}
		return
	}
	expectKept(t, c, v.id, "/root/file", want, v.pid, "victim after the crash")
}

// crashPausedKept: the paused bystander is still paused and resumes whole; it is paused again.
func crashPausedKept(t *testing.T, c *client.Client, v *crashVictim) {
	t.Helper()
	ctx := ctxT(t)
	sb, err := c.GetSandbox(ctx, v.id)
	if err != nil || sb.State != client.StatePaused {
		t.Fatalf("paused bystander after the crash: %+v %v", sb, err)
	}
	if _, err := c.ResumeSandbox(ctx, v.id); err != nil {
		t.Fatalf("resume paused bystander: %v", err)
	}
	expectKept(t, c, v.id, "/root/file", v.file, v.pid, "paused bystander")
	if _, err := c.PauseSandbox(ctx, v.id); err != nil {
		t.Fatalf("pause bystander again: %v", err)
	}
}

// crashSettled: no sandbox is in a transitional state after recovery.
func crashSettled(t *testing.T, d *spacedtest.Daemon) {
	t.Helper()
	crashSettledOr(t, d)
}

// crashOnly: the sandboxes that exist are exactly ids.
func crashOnly(t *testing.T, c *client.Client, ids []string) {
	t.Helper()
	list, err := c.ListSandboxes(ctxT(t), client.ListSandboxesOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, sb := range list {
		got = append(got, sb.ID)
	}
	slices.Sort(got)
	want := slices.Sorted(slices.Values(ids))
	if !slices.Equal(got, want) {
		t.Errorf("sandboxes after the crash: %v, want %v", got, want)
	}
}

// crashSnapshotsWhole: every snapshot of v that is listed is whole: its content reads back.
func crashSnapshotsWhole(t *testing.T, c *client.Client, v *crashVictim) {
	t.Helper()
	ctx := ctxT(t)
	snaps, err := c.ListSnapshots(ctx, v.id)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range snaps {
		if _, err := c.Diff(ctx, s.ID, ""); err != nil {
			t.Errorf("snapshot %s is listed but does not read back: %v", s.ID, err)
		}
		if err := c.DeleteSnapshot(ctx, s.ID); err != nil {
			t.Errorf("delete snapshot %s: %v", s.ID, err)
		}
	}
}

// crashNoStrays: no scratch of interrupted operations is left, and the runtimes on the host are
// exactly the running sandboxes'.
func crashNoStrays(t *testing.T, d *spacedtest.Daemon) {
	t.Helper()
	for _, sub := range []string{"forks", "work"} {
		entries, err := os.ReadDir(filepath.Join(d.Opts.Home, sub))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
		for _, e := range entries {
			t.Errorf("scratch left after recovery: %s/%s", sub, e.Name())
		}
	}
	list, err := d.Client.ListSandboxes(ctxT(t), client.ListSandboxesOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, sb := range list {
		if sb.State == client.StateRunning {
			want = append(want, sb.ID)
		}
	}
	root := filepath.Join(d.Opts.Home, "runtime", "gvisor", "runsc")
	out, err := exec.Command(filepath.Join(binDir(t), "runsc"), "--root="+root, "list", "-quiet").CombinedOutput()
	if err != nil {
		t.Fatalf("runsc list: %v: %s", err, out)
	}
	got := strings.Fields(string(out))
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("runtimes on the host %v, running sandboxes %v", got, want)
	}
}

func isNotFound(err error) bool {
	var ce *client.Error
	return errors.As(err, &ce) && ce.Status == 404
}

// TestCrashCutCheckpoint: spaced dies during a pause whose checkpoint is then found cut short
// (as a crash in the middle of writing it leaves it). The cut checkpoint is never taken for a
// finished pause: a sandbox with a full snapshot comes back from it (files and processes of the
// snapshot), one without is reported lost (error), and neither is left paused on a checkpoint
// that cannot resume.
func TestCrashCutCheckpoint(t *testing.T) {
	d := startSpaced(t, "SPACE_WARM_POOL=0")
	c := d.Client
	ctx := ctxT(t)
	waitTemplate(t, c, "base")
	baseEnv := d.Opts.Env
	for _, withSnapshot := range []bool{true, false} {
		v := crashVictimNew(t, c, "before")
		if withSnapshot {
			s, err := c.CreateSnapshot(ctx, v.id, "full", "")
			if err != nil {
				t.Fatal(err)
			}
			v.snap = s.ID
			run(t, c, v.id, "echo after > /root/file")
		}
		if err := d.Stop(); err != nil {
			t.Fatal(err)
		}
		d.Opts.Env = append(slices.Clip(baseEnv), "SPACE_CRASH_AT="+crashpoint.PauseCheckpoint)
		if err := d.Restart(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := c.PauseSandbox(ctx, v.id); err == nil {
			t.Fatal("pause acknowledged although spaced was to die in it")
		}
		if _, err := d.WaitExit(time.Minute); err != nil {
			t.Fatal(err)
		}
		cutLargest(t, filepath.Join(d.Opts.Home, "checkpoints", v.id))
		d.Opts.Env = baseEnv
		if err := d.Restart(ctx); err != nil {
			t.Fatal(err)
		}
		crashSettledOr(t, d, client.StateError)
		sb, err := c.GetSandbox(ctx, v.id)
		if err != nil {
			t.Fatal(err)
		}
		if withSnapshot {
			// Back from its latest full snapshot: its file and process as they were then.
			crashRunsOrResumes(t, c, v, "before\n")
		} else if sb.State != client.StateError {
			t.Errorf("a sandbox whose only state was a cut checkpoint is %s: want error (lost, and said so)", sb.State)
		}
		if _, err := os.Stat(filepath.Join(d.Opts.Home, "checkpoints", v.id)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the cut checkpoint is still there: %v", err)
		}
		if err := c.DeleteSandbox(ctx, v.id); err != nil {
			t.Error(err)
		}
		if v.snap != "" {
			if err := c.DeleteSnapshot(ctx, v.snap); err != nil {
				t.Error(err)
			}
		}
	}
}

// cutLargest truncates the largest file under dir to half its size.
func cutLargest(t *testing.T, dir string) {
	t.Helper()
	var big string
	var size int64
	err := filepath.WalkDir(dir, func(p string, e os.DirEntry, err error) error {
		if err != nil || !e.Type().IsRegular() {
			return err
		}
		if fi, err := e.Info(); err == nil && fi.Size() > size {
			big, size = p, fi.Size()
		}
		return nil
	})
	if err != nil || big == "" {
		t.Fatalf("no checkpoint file to cut under %s: %v", dir, err)
	}
	if err := os.Truncate(big, size/2); err != nil {
		t.Fatal(err)
	}
}

// crashSettledOr is crashSettled that also accepts the states in ok.
func crashSettledOr(t *testing.T, d *spacedtest.Daemon, ok ...string) {
	t.Helper()
	list, err := d.Client.ListSandboxes(ctxT(t), client.ListSandboxesOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, sb := range list {
		if sb.State != client.StateRunning && sb.State != client.StatePaused && !slices.Contains(ok, sb.State) {
			t.Errorf("sandbox %s is %s after recovery", sb.ID, sb.State)
		}
	}
}
