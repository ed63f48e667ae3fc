package server

import (
	"log/slog"
	"os"
	"os/signal"
	"time"

	"golang.org/x/sys/unix"
)

// reaper is the single owner of wait4 in the agent: on every SIGCHLD (and once a second, as a
// safety net and to prune old processes) it collects exit statuses and dispatches them to the
// processes the agent started. Because nothing else waits, statuses are never stolen.
type reaper struct {
	stopc chan struct{}
	done  chan struct{}
}

func startReaper(t *procTable, all bool, log *slog.Logger) *reaper {
	r := &reaper{stopc: make(chan struct{}), done: make(chan struct{})}
	sigc := make(chan os.Signal, 1)
	signal.Notify(sigc, unix.SIGCHLD)
	go func() {
		defer close(r.done)
		defer signal.Stop(sigc)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		log.Debug("reaper started", "reap_all", all)
		for {
			select {
			case <-sigc:
			case <-tick.C:
				t.prune()
			case <-r.stopc:
				return
			}
			t.reap(all)
		}
	}()
	return r
}

func (r *reaper) stop() {
	select {
	case <-r.stopc:
	default:
		close(r.stopc)
	}
	<-r.done
}
