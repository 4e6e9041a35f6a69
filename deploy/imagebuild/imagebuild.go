// Package imagebuild builds the three programs' container images without a Docker
// engine, with go-containerregistry: the same contents as deploy/docker/*.Dockerfile
// (a static binary and /healthcheck, run as uid 65532, the same labels, ports and
// entrypoint), on a base layer made here rather than pulled (passwd and group with the
// nonroot user, CA certificates, /tmp), as OCI images. A build is reproducible: every
// timestamp is the image's creation time, entries are sorted and owned by numbers, and
// the binaries carry no version-control stamp, so the same source gives the same digest.
package imagebuild

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/flytekube/backend/internal/buildinfo"
)

// Program is one of the images.
type Program struct {
	// Name is the binary's name, at /<Name> in the image, and the image's title.
	Name string
	// Package is the Go package of the binary, relative to the repository root.
	Package string
	// Description is the image's org.opencontainers.image.description.
	Description string
	// Ports are the TCP ports the program listens on by default.
	Ports []int
}

// Programs are the images the project ships, as deploy/docker has them.
var Programs = []Program{
	{Name: "executor", Package: "./executor/cmd/executor", Ports: []int{8081, 10254},
		Description: "Flyte executor: the Kubernetes operator that runs TaskAction resources"},
	{Name: "events", Package: "./events/cmd/events", Ports: []int{8090, 9090},
		Description: "Flyte action events, recorded in Postgres and served over Connect, gRPC and gRPC-Web"},
	{Name: "cacheservice", Package: "./cacheservice/cmd/cacheservice", Ports: []int{8094, 9094},
		Description: "Flyte task output cache and reservations, in Postgres, over Connect, gRPC and gRPC-Web"},
}

// Source is the repository the images name as theirs.
const Source = "https://github.com/flytekube/backend"

// HealthcheckPackage is /healthcheck's package, for docker compose's health checks (the
// image has no shell).
const HealthcheckPackage = "./deploy/docker/healthcheck"

// User is the user the programs run as, distroless's nonroot, spelt as numbers so that
// Kubernetes' runAsNonRoot can check it.
const User = "65532:65532"

// Options shape a build.
type Options struct {
	// Root is the repository's root.
	Root string
	// Arch is the target's GOARCH; the host's when empty.
	Arch string
	// Version and Revision go in the labels and are stamped into the binaries
	// (internal/buildinfo: --version, build_info); "dev" and "unknown" when empty, as
	// the Dockerfiles' defaults.
	Version, Revision string
	// Created is the creation time of the image and of every file in it; the Unix epoch
	// when zero (SOURCE_DATE_EPOCH's meaning).
	Created time.Time
	// CACertificates is the bundle copied to /etc/ssl/certs/ca-certificates.crt;
	// Debian's when empty.
	CACertificates string
}

func (o Options) withDefaults() Options {
	if o.Arch == "" {
		o.Arch = goEnv("GOARCH")
	}
	if o.Version == "" {
		o.Version = "dev"
	}
	if o.Revision == "" {
		o.Revision = "unknown"
	}
	if o.Created.IsZero() {
		o.Created = time.Unix(0, 0)
	}
	if o.CACertificates == "" {
		o.CACertificates = "/etc/ssl/certs/ca-certificates.crt"
	}
	o.Created = o.Created.UTC()
	return o
}

// Build compiles p and its health check and makes its image.
func Build(ctx context.Context, p Program, o Options) (v1.Image, error) {
	o = o.withDefaults()
	work, err := os.MkdirTemp("", "imagebuild-")
	if err != nil {
		return nil, fmt.Errorf("imagebuild: %w", err)
	}
	defer func() { _ = os.RemoveAll(work) }()
	files := map[string]string{"/" + p.Name: p.Package, "/healthcheck": HealthcheckPackage}
	app := []entry{}
	for _, path := range slices.Sorted(maps.Keys(files)) {
		out := filepath.Join(work, filepath.Base(path))
		if err := goBuild(ctx, o, files[path], out); err != nil {
			return nil, err
		}
		content, err := os.ReadFile(out)
		if err != nil {
			return nil, fmt.Errorf("imagebuild: %w", err)
		}
		app = append(app, entry{path: path, mode: 0o755, content: content})
	}
	certs, err := os.ReadFile(o.CACertificates)
	if err != nil {
		return nil, fmt.Errorf("imagebuild: CA certificates: %w", err)
	}
	base := []entry{
		{path: "/etc/", mode: 0o755},
		{path: "/etc/group", mode: 0o644, content: []byte("root:x:0:\nnonroot:x:65532:\n")},
		{path: "/etc/passwd", mode: 0o644, content: []byte("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")},
		{path: "/etc/ssl/", mode: 0o755},
		{path: "/etc/ssl/certs/", mode: 0o755},
		{path: "/etc/ssl/certs/ca-certificates.crt", mode: 0o644, content: certs},
		{path: "/home/", mode: 0o755},
		{path: "/home/nonroot/", mode: 0o700, uid: 65532},
		{path: "/tmp/", mode: 0o1777},
	}
	img := empty.Image
	for _, entries := range [][]entry{base, app} {
		layer, err := layerOf(entries, o.Created)
		if err != nil {
			return nil, err
		}
		if img, err = mutate.Append(img, mutate.Addendum{Layer: layer, MediaType: types.OCILayer,
			History: v1.History{Created: v1.Time{Time: o.Created}, CreatedBy: "imagebuild", Comment: p.Name}}); err != nil {
			return nil, fmt.Errorf("imagebuild: %w", err)
		}
	}
	img = mutate.MediaType(mutate.ConfigMediaType(img, types.OCIConfigJSON), types.OCIManifestSchema1)
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("imagebuild: %w", err)
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS, cf.Created = o.Arch, "linux", v1.Time{Time: o.Created}
	cf.Config = v1.Config{
		User:         User,
		Entrypoint:   []string{"/" + p.Name},
		Env:          []string{"PATH=/", "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"},
		WorkingDir:   "/",
		ExposedPorts: map[string]struct{}{},
		Labels: map[string]string{
			"org.opencontainers.image.title":       p.Name,
			"org.opencontainers.image.description": p.Description,
			"org.opencontainers.image.source":      Source,
			"org.opencontainers.image.url":         Source,
			"org.opencontainers.image.version":     o.Version,
			"org.opencontainers.image.revision":    o.Revision,
			"org.opencontainers.image.created":     o.Created.Format(time.RFC3339),
		},
	}
	for _, port := range p.Ports {
		cf.Config.ExposedPorts[strconv.Itoa(port)+"/tcp"] = struct{}{}
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("imagebuild: %w", err)
	}
	return img, nil
}

// goBuild compiles pkg for the image: static, without the paths of this machine or the
// toolchain's version-control stamp (which would make the same source give another
// binary when the tree is modified), its version and revision stamped from o instead.
func goBuild(ctx context.Context, o Options, pkg, out string) error {
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-buildvcs=false",
		"-ldflags=-s -w "+buildinfo.LDFlags(o.Version, o.Revision), "-o", out, pkg)
	cmd.Dir = o.Root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+o.Arch)
	if msg, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("imagebuild: go build %s: %w\n%s", pkg, err, msg)
	}
	return nil
}

// entry is a file or (with a path ending in /) a directory of a layer.
type entry struct {
	path    string
	mode    int64
	uid     int
	content []byte
}

// layerOf is a layer of entries, in the order given (parents first), every one dated
// created and owned by numbers, so that the same entries give the same bytes.
func layerOf(entries []entry, created time.Time) (v1.Layer, error) {
	var buf bytes.Buffer
	w := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.path[1:], Mode: e.mode, Uid: e.uid, Gid: e.uid, ModTime: created, Format: tar.FormatPAX,
			Typeflag: tar.TypeReg, Size: int64(len(e.content))}
		if e.path[len(e.path)-1] == '/' {
			h.Typeflag, h.Size = tar.TypeDir, 0
		}
		if err := w.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("imagebuild: %w", err)
		}
		if _, err := w.Write(e.content); err != nil {
			return nil, fmt.Errorf("imagebuild: %w", err)
		}
	}
	if err := w.Close(); err != nil {
		return nil, fmt.Errorf("imagebuild: %w", err)
	}
	raw := buf.Bytes()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(raw)), nil },
		tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("imagebuild: %w", err)
	}
	return layer, nil
}

func goEnv(name string) string {
	out, err := exec.Command("go", "env", name).Output()
	if err != nil {
		return "amd64"
	}
	return string(bytes.TrimSpace(out))
}
