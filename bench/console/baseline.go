package consolebench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"time"
)

var (
	scriptElement = regexp.MustCompile(`(?is)<script\b[^>]*>.*?</script>`)
	linkElement   = regexp.MustCompile(`(?i)<link\b[^>]*>`)
)

// staticPage makes the baseline of a view: its DOM as the console drew it, without
// scripts or links, with its style sheet inline, padded to size bytes by a comment in
// its head, so that the browser has received that much before it can draw anything.
func staticPage(dom, css string, size int64) []byte {
	dom = scriptElement.ReplaceAllString(dom, "")
	dom = linkElement.ReplaceAllString(dom, "")
	head := "<style>\n" + css + "\n</style>\n"
	page := "<!doctype html>\n" + strings.Replace(dom, "</head>", head+"</head>", 1)
	if pad := int(size) - len(page) - len("<!--  -->\n"); pad > 0 {
		page = strings.Replace(page, "</head>", "<!-- "+strings.Repeat("x", pad)+" -->\n</head>", 1)
	}
	return []byte(page)
}

// staticServer is the baseline's server: a plain net/http server on the loopback
// serving fixed pages, uncompressed, uncached.
type staticServer struct {
	url   string
	mu    sync.Mutex
	pages map[string][]byte
	srv   *http.Server
	done  chan error
}

func startStaticServer() (*staticServer, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("baseline server: %w", err)
	}
	s := &staticServer{url: "http://" + lis.Addr().String(), pages: map[string][]byte{}, done: make(chan error, 1)}
	s.srv = &http.Server{Handler: http.HandlerFunc(s.serve), ReadHeaderTimeout: 10 * time.Second}
	go func() { s.done <- s.srv.Serve(lis) }()
	return s, nil
}

// put serves page at path and returns its URL.
func (s *staticServer) put(path string, page []byte) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pages[path] = page
	return s.url + path
}

func (s *staticServer) serve(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	page, ok := s.pages[r.URL.Path]
	s.mu.Unlock()
	if !ok {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write(page)
}

func (s *staticServer) stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := s.srv.Shutdown(ctx)
	if serveErr := <-s.done; !errors.Is(serveErr, http.ErrServerClosed) {
		err = errors.Join(err, serveErr)
	}
	return err
}
