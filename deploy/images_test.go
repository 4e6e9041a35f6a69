package deploy_test

// The images `make images` builds without a Docker engine (deploy/imagebuild), held to
// the Dockerfiles: the same binaries, user, ports, entrypoint and labels.

import (
	"archive/tar"
	"context"
	"errors"
	"io"
	"log"
	"maps"
	"net/http/httptest"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/flytekube/backend/deploy/imagebuild"
	"github.com/flytekube/backend/test/repo"
)

// filesOf lists an image's files (path → tar header) as its layers stack them.
func filesOf(t *testing.T, img v1.Image) map[string]*tar.Header {
	t.Helper()
	r := mutate.Extract(img)
	defer func() { _ = r.Close() }()
	tr := tar.NewReader(r)
	out := map[string]*tar.Header{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out["/"+strings.TrimSuffix(h.Name, "/")] = h
	}
}

func TestImagesMatchTheDockerfiles(t *testing.T) {
	ctx := context.Background()
	root, err := repo.Root()
	if err != nil {
		t.Fatal(err)
	}
	if len(imagebuild.Programs) != 3 {
		t.Fatalf("%d programs; the Dockerfiles build 3", len(imagebuild.Programs))
	}
	for _, p := range imagebuild.Programs {
		t.Run(p.Name, func(t *testing.T) {
			want := loadImage(t, root, path.Join("deploy", "docker", p.Name+".Dockerfile"))
			user, labels, args := finalStage(want)
			// Labels set from build arguments hold the arguments' defaults when none are
			// given, as the image built here holds its options' defaults.
			labels["org.opencontainers.image.version"], labels["org.opencontainers.image.revision"] = args["VERSION"], args["REVISION"]
			img, err := imagebuild.Build(ctx, p, imagebuild.Options{Root: root})
			if err != nil {
				t.Fatal(err)
			}
			cf, err := img.ConfigFile()
			if err != nil {
				t.Fatal(err)
			}
			c := cf.Config
			if c.User != user || c.User != imagebuild.User {
				t.Errorf("user %q; the Dockerfile's is %q", c.User, user)
			}
			if !slices.Equal(c.Entrypoint, want.entrypoint) {
				t.Errorf("entrypoint %q; the Dockerfile's is %q", c.Entrypoint, want.entrypoint)
			}
			var ports []int
			for p := range c.ExposedPorts {
				n, _ := strconv.Atoi(strings.TrimSuffix(p, "/tcp"))
				ports = append(ports, n)
			}
			if got, want := slices.Sorted(slices.Values(ports)), slices.Sorted(slices.Values(want.exposed)); !slices.Equal(got, want) {
				t.Errorf("exposed ports %v; the Dockerfile's are %v", got, want)
			}
			for _, key := range slices.Sorted(maps.Keys(labels)) {
				if key == "org.opencontainers.image.base.name" { // built here, on no base image
					continue
				}
				if c.Labels[key] != labels[key] {
					t.Errorf("label %s = %q; the Dockerfile's is %q", key, c.Labels[key], labels[key])
				}
			}
			if cf.OS != "linux" || cf.Architecture == "" {
				t.Errorf("platform %s/%s", cf.OS, cf.Architecture)
			}

			// The Dockerfile's binaries, where it puts them, executable; the nonroot
			// user and the CA certificates of the distroless base.
			files := filesOf(t, img)
			for dst := range want.files {
				if h := files[dst]; h == nil || h.Typeflag != tar.TypeReg || h.Mode&0o111 == 0 || h.Size == 0 {
					t.Errorf("%s: %+v; want an executable file, as the Dockerfile copies it", dst, h)
				}
			}
			for _, f := range []string{"/etc/passwd", "/etc/group", "/etc/ssl/certs/ca-certificates.crt", "/tmp", "/home/nonroot"} {
				if files[f] == nil {
					t.Errorf("%s missing; files %v", f, slices.Sorted(maps.Keys(files)))
				}
			}
			if h := files["/home/nonroot"]; h != nil && (h.Uid != 65532 || h.Gid != 65532) {
				t.Errorf("/home/nonroot owned by %d:%d; want the nonroot user's", h.Uid, h.Gid)
			}
		})
	}
}

// TestImagesAreReproducible: the same source gives the same digest, and an image pushed
// to a registry comes back the same.
func TestImagesAreReproducible(t *testing.T) {
	ctx := context.Background()
	root, err := repo.Root()
	if err != nil {
		t.Fatal(err)
	}
	p := imagebuild.Programs[0]
	var digests []v1.Hash
	var img v1.Image
	for range 2 {
		if img, err = imagebuild.Build(ctx, p, imagebuild.Options{Root: root, Version: "v1.2.3", Revision: "abc"}); err != nil {
			t.Fatal(err)
		}
		d, err := img.Digest()
		if err != nil {
			t.Fatal(err)
		}
		digests = append(digests, d)
	}
	if digests[0] != digests[1] {
		t.Fatalf("two builds of one source: %s and %s", digests[0], digests[1])
	}

	// A registry on loopback (go-containerregistry's own, in memory).
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	ref, err := name.NewTag(strings.TrimPrefix(srv.URL, "http://") + "/flytekube/" + p.Name + ":v1.2.3")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img, remote.WithContext(ctx)); err != nil {
		t.Fatal(err)
	}
	pulled, err := remote.Image(ref, remote.WithContext(ctx))
	if err != nil {
		t.Fatal(err)
	}
	if d, err := pulled.Digest(); err != nil || d != digests[0] {
		t.Fatalf("pulled %s (%v); pushed %s", d, err, digests[0])
	}
}

// TestImagedBinariesSayTheirVersion: the binaries an image holds are stamped with its
// version and revision, so --version and build_info name the image's release.
func TestImagedBinariesSayTheirVersion(t *testing.T) {
	ctx := context.Background()
	root, err := repo.Root()
	if err != nil {
		t.Fatal(err)
	}
	p := imagebuild.Programs[1]
	img, err := imagebuild.Build(ctx, p, imagebuild.Options{Root: root, Version: "v1.2.3", Revision: "abc"})
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), p.Name)
	r := mutate.Extract(img)
	defer func() { _ = r.Close() }()
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err != nil {
			t.Fatalf("/%s not found in the image: %v", p.Name, err)
		}
		if h.Name != p.Name {
			continue
		}
		content, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(bin, content, 0o755); err != nil {
			t.Fatal(err)
		}
		break
	}
	out, err := exec.Command(bin, "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("%s --version: %v\n%s", p.Name, err, out)
	}
	if want := p.Name + " v1.2.3 (commit abc, "; !strings.HasPrefix(string(out), want) {
		t.Errorf("--version printed %q; want it to start %q", out, want)
	}
}
