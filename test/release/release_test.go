package release

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/flytekube/backend/test/repo"
)

func TestParse(t *testing.T) {
	const commit = "5a96befc044bdc7026488447c4bb1c80ec6190dc"
	tests := []struct {
		name    string
		in      string
		want    []Release
		wantErr string
	}{
		{name: "comments and blank lines", in: "# header\n\nv0.1.0\t" + commit + "\t2026-12-01 # first\n",
			want: []Release{{Version: "v0.1.0", Commit: commit, Date: "2026-12-01"}}},
		{name: "two, oldest first", in: "v0.1.0 " + commit + " 2026-12-01\nv0.2.0 " + commit + " 2026-12-09\n",
			want: []Release{{"v0.1.0", commit, "2026-12-01"}, {"v0.2.0", commit, "2026-12-09"}}},
		{name: "short commit", in: "v0.1.0 5a96bef 2026-12-01\n", wantErr: "not a version and a full commit"},
		{name: "no v", in: "0.1.0 " + commit + " 2026-12-01\n", wantErr: "not a version and a full commit"},
		{name: "missing date", in: "v0.1.0 " + commit + "\n", wantErr: "got 2 fields"},
		{name: "bad date", in: "v0.1.0 " + commit + " 12/01/2026\n", wantErr: "date"},
		{name: "twice", in: "v0.1.0 " + commit + " 2026-12-01\nv0.1.0 " + commit + " 2026-12-01\n", wantErr: "listed twice"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse([]byte(tt.in))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Parse: error %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("Parse: %v, want %v", got, tt.want)
			}
			for i := range got {
				if got[i] != tt.want[i] {
					t.Errorf("release %d: %+v, want %+v", i, got[i], tt.want[i])
				}
			}
		})
	}
}

// The repository's own RELEASES parses, and each release's commit is in the history a
// fresh clone has, which the upgrade test builds from.
func TestRepositoryReleases(t *testing.T) {
	root, err := repo.Root()
	if err != nil {
		t.Fatal(err)
	}
	all, err := Load(root)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) == 0 {
		t.Fatal("RELEASES lists no release")
	}
	latest, err := Find(root, "latest")
	if err != nil || latest != all[len(all)-1] {
		t.Fatalf("Find(latest) = %+v, %v; want the last line", latest, err)
	}
	if first, err := Find(root, "first"); err != nil || first != all[0] {
		t.Fatalf("Find(first) = %+v, %v; want the first line", first, err)
	}
	for _, r := range all {
		if out, err := exec.Command("git", "-C", root, "cat-file", "-e", r.Commit+"^{commit}").CombinedOutput(); err != nil {
			t.Errorf("%s: commit %s is not in this clone's history: %v %s", r.Version, r.Commit, err, out)
		}
	}
	if _, err := Find(root, "v0.0.0-never"); err == nil {
		t.Fatal("Find of an unknown version: no error")
	}
}

// TestExtractWritesACommitsTree: a commit's tree is written out, with git archive and tar
// each reporting to a buffer of its own (one shared buffer was a data race the race
// detector caught on a machine's first build of a release).
func TestExtractWritesACommitsTree(t *testing.T) {
	root, err := repo.Root()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := extract(context.Background(), root, "HEAD", dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "go.mod")); err != nil {
		t.Errorf("the extracted tree lacks go.mod: %v", err)
	}
}

// TestNewestMigration reads a release's migrations from its commit: v0.2.0's events store
// ended at 00011 and its cache store at 00006 (CHANGELOG.md); a directory it lacks has none.
func TestNewestMigration(t *testing.T) {
	root, err := repo.Root()
	if err != nil {
		t.Fatal(err)
	}
	v020, err := Find(root, "v0.2.0")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		dir  string
		want int64
	}{
		{"events/store/migrations", 11},
		{"cacheservice/store/migrations", 6},
		{"no/such/dir", 0},
	} {
		if got, err := v020.NewestMigration(root, tc.dir); err != nil || got != tc.want {
			t.Errorf("NewestMigration(%s) = %d, %v; want %d", tc.dir, got, err, tc.want)
		}
	}
}
