package sandbox

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

// heartbeat is how often a long step says it is still at work.
const heartbeat = time.Minute

// longStep runs fn, having said what it does and how long it takes the first time
// (measured by hack/first-run.sh: README.md, "The first run"); while fn runs, a line every
// period says how long it has taken so far, and once it took a period or more, a line
// says how long. A first run builds for minutes, and a terminal silent that long reads as
// a hang.
func longStep(say func(string, ...any), what, firstTime string, period time.Duration, fn func() error) error {
	say("%s (%s the first time)", what, firstTime)
	start := time.Now()
	done := make(chan struct{})
	var beats sync.WaitGroup
	beats.Add(1)
	go func() {
		defer beats.Done()
		tick := time.NewTicker(period)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				say("  still %s: %s so far", what, time.Since(start).Round(time.Second))
			}
		}
	}()
	err := fn()
	close(done)
	beats.Wait() // no line of this step after it returns
	if took := time.Since(start); err == nil && took >= period {
		say("  %s: done in %s", what, took.Round(time.Second))
	}
	return err
}

// LogLibrariesTo sends what controller-runtime and client-go log to the file at path, and
// returns what closes it. Their lines (a watch that ended, a retried request) are not the
// user's business while the sandbox runs, and controller-runtime otherwise prints a
// goroutine stack to stderr ("log.SetLogger(...) was never called") once it has been
// loaded for 30 s: a first run's builds take longer than that.
func LogLibrariesTo(path string) (func() error, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	logger := logr.FromSlogHandler(slog.NewTextHandler(f, nil))
	ctrllog.SetLogger(logger)
	klog.SetLogger(logger)
	return f.Close, nil
}

// How long the sandbox's builds take the first time, on 2 cores with empty Go caches
// (hack/first-run.sh; README.md, "The first run").
const (
	firstBuildPrograms   = "about 1 min"
	firstBuildPrometheus = "4 to 6 min"
)
