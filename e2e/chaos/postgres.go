package chaos

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/flytekube/backend/test/ports"
)

// postgres is a throwaway cluster of the soak's own, started by hack/postgres.sh even
// when TEST_DATABASE_URL names a server: the soak restarts it. Its commits are durable
// across the soak's restarts (FLYTE_PG_DURABLE).
type postgres struct {
	root, dir, url string
	// addr is the server's TCP address (127.0.0.1), which the fault proxy forwards to;
	// url reaches it there too.
	addr string
}

func startPostgres(ctx context.Context, root string) (*postgres, error) {
	port, err := ports.Free(1)
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, filepath.Join(root, "hack", "postgres.sh"), "start")
	cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "TEST_DATABASE_URL=") })
	// Durable commits: the soak kills the server at once, and a test cluster's
	// synchronous_commit=off would lose what the events service acknowledged, an event
	// lost to the test's own shortcut rather than to the system.
	cmd.Env = append(cmd.Env, "FLYTE_PG_DURABLE=1")
	// A TCP port besides the socket, for the fault proxy to stand in front of.
	cmd.Env = append(cmd.Env, "FLYTE_PG_TCP_PORT="+strconv.Itoa(port[0]))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("hack/postgres.sh start: %w\n%s", err, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) < 2 {
		return nil, fmt.Errorf("hack/postgres.sh start printed %q", out)
	}
	return &postgres{root: root, dir: lines[len(lines)-2], url: lines[len(lines)-1], addr: "127.0.0.1:" + strconv.Itoa(port[0])}, nil
}

// restartImmediate stops the server without a shutdown checkpoint, as a crash would,
// and starts it again at once on the same socket (pg_ctl restart keeps its options).
func (p *postgres) restartImmediate(ctx context.Context) error {
	bin, err := filepath.Glob("/usr/lib/postgresql/*/bin/pg_ctl")
	if err != nil || len(bin) == 0 {
		return fmt.Errorf("postgres: no pg_ctl found")
	}
	slices.Sort(bin)
	args := []string{bin[len(bin)-1], "-D", filepath.Join(p.dir, "data"), "-l", filepath.Join(p.dir, "postgres.log"), "-m", "immediate", "-w", "-t", "60", "restart"}
	if os.Geteuid() == 0 { // the cluster is the postgres user's, as initdb refuses root
		args = append([]string{"runuser", "-u", "postgres", "--"}, args...)
	}
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, args[0], args[1:]...).CombinedOutput(); err != nil {
		return fmt.Errorf("postgres: immediate restart: %w\n%s", err, out)
	}
	return nil
}

func (p *postgres) stop() {
	_ = exec.Command(filepath.Join(p.root, "hack", "postgres.sh"), "stop", p.dir).Run()
}
