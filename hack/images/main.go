// Command images builds the three programs' images without a Docker engine (package
// deploy/imagebuild) and writes each as a tarball that `ctr images import` and `docker
// load` read, named <repository>/<program>:<version> and :<tag> (each of --tag's); with
// --push it pushes them to that repository instead of, or as well as, writing them. The
// binaries are stamped with --version and --revision. `make images` runs it.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/flytekube/backend/deploy/imagebuild"
	"github.com/flytekube/backend/test/repo"
)

func main() {
	out := flag.String("out", "build/images", "where to write <program>.tar; empty writes none")
	repository := flag.String("repository", "ghcr.io/flytekube", "the images' repository")
	version := flag.String("version", "dev", "the release the images hold (make version): their first tag, their version label and what their binaries say")
	tags := flag.String("tag", "", "more tags, comma-separated (such as dev or latest)")
	revision := flag.String("revision", "unknown", "the source commit, for the revision label and the binaries")
	push := flag.Bool("push", false, "push the images to --repository (with the credentials of ~/.docker/config.json)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, *out, *repository, *version, *tags, *revision, *push); err != nil {
		fmt.Fprintln(os.Stderr, "images:", err)
		os.Exit(1)
	}
}

// refs names a program's image by the version first, then by each other tag, once each.
func refs(repository, program, version, tags string) ([]name.Tag, error) {
	var out []name.Tag
	seen := map[string]bool{}
	for _, t := range append([]string{version}, strings.Split(tags, ",")...) {
		if t = strings.TrimSpace(t); t == "" || seen[t] {
			continue
		}
		seen[t] = true
		ref, err := name.NewTag(repository+"/"+program+":"+t, name.StrictValidation)
		if err != nil {
			return nil, fmt.Errorf("image tag %q: %w", t, err)
		}
		out = append(out, ref)
	}
	return out, nil
}

func run(ctx context.Context, out, repository, version, tags, revision string, push bool) error {
	root, err := repo.Root()
	if err != nil {
		return err
	}
	o := imagebuild.Options{Root: root, Version: version, Revision: revision}
	// SOURCE_DATE_EPOCH dates a build as reproducible-builds.org has it.
	if epoch := os.Getenv("SOURCE_DATE_EPOCH"); epoch != "" {
		s, err := strconv.ParseInt(epoch, 10, 64)
		if err != nil {
			return fmt.Errorf("SOURCE_DATE_EPOCH: %w", err)
		}
		o.Created = time.Unix(s, 0)
	}
	if out != "" {
		if err := os.MkdirAll(out, 0o755); err != nil {
			return err
		}
	}
	for _, p := range imagebuild.Programs {
		img, err := imagebuild.Build(ctx, p, o)
		if err != nil {
			return err
		}
		names, err := refs(repository, p.Name, version, tags)
		if err != nil {
			return err
		}
		digest, err := img.Digest()
		if err != nil {
			return err
		}
		if out != "" {
			path := filepath.Join(out, p.Name+".tar")
			byRef := map[name.Reference]v1.Image{}
			for _, ref := range names {
				byRef[ref] = img
			}
			if err := tarball.MultiRefWriteToFile(path, byRef); err != nil {
				return fmt.Errorf("writing %s: %w", path, err)
			}
			for _, ref := range names {
				fmt.Printf("%s %s %s\n", ref, digest, path)
			}
		}
		for _, ref := range names {
			if !push {
				break
			}
			if err := remote.Write(ref, img, remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)); err != nil {
				return fmt.Errorf("pushing %s: %w", ref, err)
			}
			fmt.Printf("%s %s pushed\n", ref, digest)
		}
	}
	return nil
}
