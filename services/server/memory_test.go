package server_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/flytekube/backend/gen/go/flyte/events/v1/eventsv1connect"
	"github.com/flytekube/backend/services/server"
	"github.com/flytekube/backend/test/repo"
	"github.com/flytekube/backend/test/servicetest"
)

// The memory test runs the server in a process of its own, this test binary started
// again with memoryChildEnv set, so that its resident set is what is measured and not
// the attacking clients'.
const (
	memoryChildEnv  = "SERVER_MEMORY_CHILD"
	childCertEnv    = "SERVER_MEMORY_CHILD_CERT"
	childKeyEnv     = "SERVER_MEMORY_CHILD_KEY"
	childReviewEnv  = "SERVER_MEMORY_CHILD_REVIEW"
	childBodyEnv    = "SERVER_MEMORY_CHILD_BODY_TIMEOUT"
	childListenLine = "listening on "
)

// eventsCodeRSS is how much of the events binary is resident once it has started (its
// RssFile in /proc: 45 MB of a 54 MB resident set, measured waiting for its database).
// None of it counts against GOMEMLIMIT. The test binary is smaller; the child makes up
// the difference with memory the Go runtime does not manage, so that GOMEMLIMIT leaves
// it the headroom the service has, and no more.
const eventsCodeRSS = 45 << 20

// TestMain runs the server TestStalledStreamsStayUnderTheMemoryLimit measures when this
// binary is started as its child, and the tests otherwise.
func TestMain(m *testing.M) {
	if os.Getenv(memoryChildEnv) != "" {
		if err := serveMemoryChild(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// serveMemoryChild is the events service's server with its defaults and TLS, whose token
// review takes as long as childReviewEnv says. It serves until its standard input closes.
func serveMemoryChild() error {
	review, err := time.ParseDuration(os.Getenv(childReviewEnv))
	if err != nil {
		return err
	}
	bodyTimeout, err := time.ParseDuration(os.Getenv(childBodyEnv))
	if err != nil {
		return err
	}
	srv, err := server.New(server.Config{
		Addr:            "127.0.0.1:0",
		TLSCertFile:     os.Getenv(childCertEnv),
		TLSKeyFile:      os.Getenv(childKeyEnv),
		BodyReadTimeout: bodyTimeout,
		// A token review happens before the body is read, as authentication does.
		Middleware: func(next http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				select {
				case <-time.After(review):
					next.ServeHTTP(w, r)
				case <-r.Context().Done():
				}
			})
		},
	}, slog.New(slog.DiscardHandler))
	if err != nil {
		return err
	}
	server.Handle(srv, &testService{}, eventsv1connect.NewEventsServiceHandler)
	if err := padResidentSet(eventsCodeRSS); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	fmt.Printf("%s%s\n", childListenLine, srv.Addr())
	return srv.Serve(ctx)
}

// padResidentSet makes this process hold size bytes resident that GOMEMLIMIT does not
// count: its resident file pages, and anonymous pages the Go runtime does not manage for
// what they fall short.
func padResidentSet(size int64) error {
	rss, err := statusField(os.Getpid(), "RssFile")
	if err != nil {
		return err
	}
	missing := size - rss
	if missing <= 0 {
		return nil
	}
	pad, err := syscall.Mmap(-1, 0, int(missing), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		return fmt.Errorf("padding the resident set: %w", err)
	}
	for i := 0; i < len(pad); i += os.Getpagesize() {
		pad[i] = 1 // resident once written
	}
	return nil
}

// TestStalledStreamsStayUnderTheMemoryLimit: the events service's server, run as its
// Deployment runs it (GOMEMLIMIT and CPUs from the manifest), keeps its resident set
// under the Deployment's memory limit while many HTTP/2 streams send part of a large
// Record body and stall, whether their bodies are read at once or wait on a slow token
// review, and while thousands of streams send headers and nothing more.
func TestStalledStreamsStayUnderTheMemoryLimit(t *testing.T) {
	deployed := eventsDeployment(t)
	pki := servicetest.NewPKI(t)
	t.Cleanup(func() {
		if childExe != "" {
			_ = os.Remove(childExe)
		}
	})
	const bodyTimeout = 6 * time.Second
	tests := []struct {
		name           string
		conns, streams int           // streams per connection
		sent           int           // bytes each stream sends of an 8 MB message
		review         time.Duration // how long the token review takes
	}{
		{"40 streams each sending 4 MB of 8 MB", 1, 40, 4 << 20, 0},
		{"40 connections of 10 such streams", 40, 10, 4 << 20, 0},
		{"bodies buffered during a slow token review", 200, 5, 4 << 20, 3 * time.Second},
		{"headers and no body on 100 connections of 100 streams", 100, 100, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			child := startMemoryChild(t, deployed, pki, tt.review, bodyTimeout)
			before := child.status(t, "VmRSS")

			// Every stream is answered within the review and the body read deadline;
			// what the connection limit makes wait is not needed to reach the peak.
			ctx, cancel := context.WithTimeout(context.Background(), tt.review+bodyTimeout+5*time.Second)
			defer cancel()
			var wg sync.WaitGroup
			for range tt.conns {
				client := pki.Client("") // a connection of its own
				defer client.CloseIdleConnections()
				for range tt.streams {
					wg.Go(func() { _ = stalledRecord(ctx, client, child.url, tt.sent) })
				}
			}
			wg.Wait()
			peak := child.status(t, "VmHWM")
			t.Logf("resident set: %d MiB before, %d MiB at its peak (GOMEMLIMIT %s, limit %d MiB)",
				before>>20, peak>>20, deployed.goMemLimit, deployed.memoryLimit>>20)
			if peak >= deployed.memoryLimit {
				t.Errorf("the server's resident set reached %d MiB; its Deployment's memory limit is %d MiB", peak>>20, deployed.memoryLimit>>20)
			}
		})
	}
}

// deployment is how the events Deployment runs its container.
type deployment struct {
	memoryLimit int64
	goMemLimit  string // the GOMEMLIMIT it is given
	cpus        int64
}

// eventsDeployment reads the events container's limits and GOMEMLIMIT from the kustomize
// base.
func eventsDeployment(t *testing.T) deployment {
	t.Helper()
	path, err := repo.Path("deploy", "kustomize", "base", "events", "events.yaml")
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for doc := range strings.SplitSeq(string(data), "\n---\n") {
		var d appsv1.Deployment
		if err := yaml.Unmarshal([]byte(doc), &d); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if d.Kind != "Deployment" || d.Name != "events" {
			continue
		}
		for _, c := range d.Spec.Template.Spec.Containers {
			if c.Name == "events" {
				return containerMemory(t, c)
			}
		}
	}
	t.Fatalf("%s has no Deployment events with a container events", path)
	return deployment{}
}

func containerMemory(t *testing.T, c corev1.Container) deployment {
	t.Helper()
	d := deployment{memoryLimit: c.Resources.Limits.Memory().Value(), cpus: c.Resources.Limits.Cpu().Value()}
	for _, e := range c.Env {
		if e.Name != "GOMEMLIMIT" {
			continue
		}
		d.goMemLimit = e.Value
		if ref := e.ValueFrom; ref != nil && ref.ResourceFieldRef != nil {
			// What the kubelet writes: the resource in units of the divisor, rounded up.
			q := c.Resources.Limits[corev1.ResourceName(strings.TrimPrefix(ref.ResourceFieldRef.Resource, "limits."))]
			divisor := ref.ResourceFieldRef.Divisor.Value()
			if divisor == 0 {
				divisor = 1
			}
			d.goMemLimit = strconv.FormatInt((q.Value()+divisor-1)/divisor, 10)
		}
	}
	if d.memoryLimit == 0 || d.goMemLimit == "" {
		t.Fatalf("container %s has no memory limit or no GOMEMLIMIT", c.Name)
	}
	return d
}

type memoryChild struct {
	url string
	pid int
}

// startMemoryChild starts the server in a process of its own with the Deployment's
// GOMEMLIMIT and CPUs; it is stopped when the test ends.
func startMemoryChild(t *testing.T, d deployment, pki *servicetest.PKI, review, bodyTimeout time.Duration) *memoryChild {
	t.Helper()
	exe := childExecutable(t)
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(),
		memoryChildEnv+"=1", childCertEnv+"="+pki.CertFile, childKeyEnv+"="+pki.KeyFile,
		childReviewEnv+"="+review.String(), childBodyEnv+"="+bodyTimeout.String(),
		"GOMEMLIMIT="+d.goMemLimit, "GOMAXPROCS="+strconv.FormatInt(max(d.cpus, 1), 10))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	t.Cleanup(func() {
		_ = stdin.Close()
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	lines := bufio.NewScanner(stdout)
	addr := ""
	for lines.Scan() {
		if a, ok := strings.CutPrefix(lines.Text(), childListenLine); ok {
			addr = a
			break
		}
	}
	go func() {
		_, _ = io.Copy(io.Discard, stdout)
		exited <- cmd.Wait()
	}()
	if addr == "" {
		_ = cmd.Process.Kill()
		<-exited
		t.Fatalf("the server process did not start: %s", stderr.String())
	}
	return &memoryChild{url: "https://" + addr, pid: cmd.Process.Pid}
}

// status reads a size in bytes from the process's /proc status, such as VmRSS (its
// resident set now) or VmHWM (the most it has been).
func (c *memoryChild) status(t testing.TB, field string) int64 {
	t.Helper()
	v, err := statusField(c.pid, field)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// statusField reads a size field (in kB) of /proc/<pid>/status, in bytes.
func statusField(pid int, field string) (int64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(data)) {
		if value, ok := strings.CutPrefix(line, field+":"); ok {
			kib, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(value), " kB"), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("%s: %w", field, err)
			}
			return kib << 10, nil
		}
	}
	return 0, fmt.Errorf("/proc/%d/status has no %s", pid, field)
}

// zeros is what the stalled bodies send; the pipes only read it.
var zeros = make([]byte, 64<<10)

// stalledRecord starts a gRPC Record call that sends sent bytes of an 8 MB message and
// then nothing until ctx ends, and returns when the server has answered it. With sent
// 0 it sends headers alone, declaring a body of one byte (so that the client keeps no
// buffer for it).
func stalledRecord(ctx context.Context, client *http.Client, url string, sent int) error {
	const declared = 8 << 20
	pr, pw := io.Pipe()
	defer func() { _ = pw.Close() }()
	length := int64(1)
	if sent > 0 {
		length = 5 + declared
		go func() {
			prefix := make([]byte, 5)
			binary.BigEndian.PutUint32(prefix[1:], declared)
			if _, err := pw.Write(prefix); err != nil {
				return
			}
			for n := 0; n < sent; n += len(zeros) {
				if _, err := pw.Write(zeros[:min(len(zeros), sent-n)]); err != nil {
					return
				}
			}
		}()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+eventsv1connect.EventsServiceRecordProcedure, pr)
	if err != nil {
		return err
	}
	req.ContentLength = length
	req.Header.Set("Content-Type", "application/grpc")
	req.Header.Set("Te", "trailers")
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	_, err = io.Copy(io.Discard, resp.Body)
	return err
}

var (
	childOnce sync.Once
	childExe  string
	childErr  error
)

// childExecutable is this test binary, or, when it runs with the race detector (which
// multiplies the memory a process takes several times over, as make test runs it), the
// same tests built without it: the figure measured must be the server's, as deployed.
func childExecutable(t *testing.T) string {
	t.Helper()
	if !raceEnabled {
		exe, err := os.Executable()
		if err != nil {
			t.Fatal(err)
		}
		return exe
	}
	childOnce.Do(func() {
		// Kept in the user's cache, one file overwritten by each run, not one per run.
		dir, err := os.UserCacheDir()
		if err == nil {
			dir = filepath.Join(dir, "flyte-executor", "server-memory-test")
			err = os.MkdirAll(dir, 0o755)
		}
		if err != nil {
			childErr = err
			return
		}
		childExe = filepath.Join(dir, fmt.Sprintf("server.%d.test", os.Getpid()))
		build := exec.Command("go", "test", "-c", "-o", childExe, ".")
		if out, err := build.CombinedOutput(); err != nil {
			childErr = fmt.Errorf("building the tests without the race detector: %w\n%s", err, out)
		}
	})
	if childErr != nil {
		t.Fatal(childErr)
	}
	return childExe
}
