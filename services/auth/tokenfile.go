package auth

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/token/tokenfile"
)

// tokenFileRecheck is how often the token file's modification time is looked at; a
// rewritten file takes effect within it, without a restart.
const tokenFileRecheck = time.Second

// reloadingTokenFile is kube-apiserver's static token authenticator over a file that an
// operator may rewrite to add, rotate or revoke tokens. A file that vanishes or no longer
// parses keeps the last good tokens, so a bad edit does not lock everyone out; it is
// logged and counted once per version of the file, and the metrics say since when the
// tokens served are not the file's.
type reloadingTokenFile struct {
	path    string
	log     *slog.Logger
	metrics tokenFileMetrics

	mu      sync.Mutex
	tokens  *tokenfile.TokenAuthenticator
	loaded  fileVersion // of the tokens served
	failed  fileVersion // the last version that failed to load, zero after a good one
	checked time.Time
}

// fileVersion tells one state of the file from another: its modification time and size,
// or why it could not be looked at.
type fileVersion struct {
	modTime int64 // Unix nanoseconds, so that versions compare with ==
	size    int64
	statErr string
}

func versionOf(info os.FileInfo) fileVersion {
	return fileVersion{modTime: info.ModTime().UnixNano(), size: info.Size()}
}

// tokenFileMetrics are what an alert watches: a file that stays broken shows as a last
// load that failed and a last good load that grows old.
type tokenFileMetrics struct {
	lastSuccess prometheus.Gauge
	successful  prometheus.Gauge
	failures    prometheus.Counter
}

func newTokenFileMetrics(reg prometheus.Registerer) (tokenFileMetrics, error) {
	m := tokenFileMetrics{
		lastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "flyte_auth_token_file_last_load_success_timestamp_seconds",
			Help: "When the token file was last read successfully (Unix time): the tokens served are that version's.",
		}),
		successful: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "flyte_auth_token_file_last_load_successful",
			Help: "1 when the token file as it is now is what is served; 0 while it is missing or does not parse, and the last good tokens are still served.",
		}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "flyte_auth_token_file_load_failures_total",
			Help: "Versions of the token file that could not be read or parsed, each counted once.",
		}),
	}
	for _, c := range []prometheus.Collector{m.lastSuccess, m.successful, m.failures} {
		if err := reg.Register(c); err != nil {
			return tokenFileMetrics{}, fmt.Errorf("auth: registering token file metrics: %w", err)
		}
	}
	return m, nil
}

func newReloadingTokenFile(path string, reg prometheus.Registerer, log *slog.Logger) (*reloadingTokenFile, error) {
	metrics, err := newTokenFileMetrics(reg)
	if err != nil {
		return nil, err
	}
	f := &reloadingTokenFile{path: path, log: log, metrics: metrics}
	info, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("auth-token-file: %w", err)
	}
	tokens, err := tokenfile.NewCSV(path)
	if err != nil {
		return nil, fmt.Errorf("auth-token-file: %w", err)
	}
	f.serve(tokens, versionOf(info))
	f.checked = time.Now()
	return f, nil
}

func (f *reloadingTokenFile) AuthenticateToken(ctx context.Context, token string) (*authenticator.Response, bool, error) {
	return f.current().AuthenticateToken(ctx, token)
}

// current returns the tokens, reading the file again when it changed since the last look.
func (f *reloadingTokenFile) current() *tokenfile.TokenAuthenticator {
	f.mu.Lock()
	defer f.mu.Unlock()
	if time.Since(f.checked) < tokenFileRecheck {
		return f.tokens
	}
	f.checked = time.Now()
	info, err := os.Stat(f.path)
	switch {
	case err != nil:
		f.failedToLoad(fileVersion{statErr: err.Error()}, err)
	case versionOf(info) == f.loaded:
		// Back as it was loaded (after a failed edit was undone, say).
		f.failed = fileVersion{}
		f.metrics.successful.Set(1)
	case versionOf(info) == f.failed:
		// Already logged and counted.
	default:
		f.load(versionOf(info))
	}
	return f.tokens
}

func (f *reloadingTokenFile) load(v fileVersion) {
	tokens, err := tokenfile.NewCSV(f.path)
	if err != nil {
		f.failedToLoad(v, err)
		return
	}
	f.serve(tokens, v)
	f.log.Info("token file read again", "path", f.path)
}

// serve serves tokens, read from version v of the file.
func (f *reloadingTokenFile) serve(tokens *tokenfile.TokenAuthenticator, v fileVersion) {
	f.tokens, f.loaded, f.failed = tokens, v, fileVersion{}
	f.metrics.lastSuccess.SetToCurrentTime()
	f.metrics.successful.Set(1)
}

// failedToLoad logs and counts a version of the file that could not be loaded, once.
func (f *reloadingTokenFile) failedToLoad(v fileVersion, err error) {
	f.metrics.successful.Set(0)
	if v == f.failed {
		return
	}
	f.failed = v
	f.metrics.failures.Inc()
	f.log.Error("the token file cannot be read or does not parse; keeping the tokens read before", "path", f.path, "error", err)
}
