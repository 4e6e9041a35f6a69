package auth

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/token/tokenfile"
)

// tokenFileRecheck is how often the token file's modification time is looked at; a
// rewritten file takes effect within it, without a restart.
const tokenFileRecheck = time.Second

// reloadingTokenFile is kube-apiserver's static token authenticator over a file that an
// operator may rewrite to add, rotate or revoke tokens. A file that no longer parses
// keeps the last good tokens and is logged.
type reloadingTokenFile struct {
	path string
	log  *slog.Logger

	mu      sync.Mutex
	tokens  *tokenfile.TokenAuthenticator
	modTime time.Time
	size    int64
	checked time.Time
}

func newReloadingTokenFile(path string, log *slog.Logger) (*reloadingTokenFile, error) {
	f := &reloadingTokenFile{path: path, log: log}
	info, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("auth-token-file: %w", err)
	}
	if f.tokens, err = tokenfile.NewCSV(path); err != nil {
		return nil, fmt.Errorf("auth-token-file: %w", err)
	}
	f.modTime, f.size, f.checked = info.ModTime(), info.Size(), time.Now()
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
	if err != nil || (info.ModTime().Equal(f.modTime) && info.Size() == f.size) {
		return f.tokens
	}
	tokens, err := tokenfile.NewCSV(f.path)
	if err != nil {
		f.log.Error("the token file changed but does not parse; keeping the tokens read before", "path", f.path, "error", err)
		return f.tokens
	}
	f.tokens, f.modTime, f.size = tokens, info.ModTime(), info.Size()
	f.log.Info("token file read again", "path", f.path)
	return f.tokens
}
