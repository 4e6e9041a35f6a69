// Command images builds the three programs' images without a Docker engine (package
// internal/imagebuild) and writes each as a tarball that `ctr images import` and `docker
// load` read, named <repository>/<program>:<tag>; with --push it pushes them to that
// repository instead of, or as well as, writing them. `make images` runs it.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/flytekube/backend/internal/imagebuild"
	"github.com/flytekube/backend/internal/repo"
)

func main() {
	out := flag.String("out", "build/images", "where to write <program>.tar; empty writes none")
	repository := flag.String("repository", "ghcr.io/flytekube", "the images' repository")
	tag := flag.String("tag", "dev", "the images' tag, also their version label")
	revision := flag.String("revision", "unknown", "the source revision, for the revision label")
	push := flag.Bool("push", false, "push the images to --repository (with the credentials of ~/.docker/config.json)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, *out, *repository, *tag, *revision, *push); err != nil {
		fmt.Fprintln(os.Stderr, "images:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, out, repository, tag, revision string, push bool) error {
	root, err := repo.Root()
	if err != nil {
		return err
	}
	o := imagebuild.Options{Root: root, Version: tag, Revision: revision}
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
		ref, err := name.NewTag(repository + "/" + p.Name + ":" + tag)
		if err != nil {
			return err
		}
		digest, err := img.Digest()
		if err != nil {
			return err
		}
		if out != "" {
			path := filepath.Join(out, p.Name+".tar")
			if err := tarball.WriteToFile(path, ref, img); err != nil {
				return fmt.Errorf("writing %s: %w", path, err)
			}
			fmt.Printf("%s %s %s\n", ref, digest, path)
		}
		if push {
			if err := remote.Write(ref, img, remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)); err != nil {
				return fmt.Errorf("pushing %s: %w", ref, err)
			}
			fmt.Printf("%s %s pushed\n", ref, digest)
		}
	}
	return nil
}
