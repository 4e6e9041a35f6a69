package datastore

import (
	"context"
	"errors"
	"fmt"
	"github.com/flytekube/backend/executor/storage"
	"io"
	"io/fs"
	"os"
	"path"
	"regexp"
	"strings"
	"syscall"
)

// Staged mounts (storage.HostPathStore).
//
// The kubelet resolves a hostPath volume when it mounts it, following symbolic links,
// some time after the executor handed the path out. Had a pod's writable mount been a
// directory of the data store, another action's paths could lie inside it (their
// runOutputBase or inputUri is theirs to choose), and that pod could swap a directory on
// their way for a link to any host path between the executor's check and the mount. So
// no pod writes in the data store: each attempt has a staging directory,
//
//	<prefix's directory>/.flyte-staging/<attempt>/in/<input's name>   (a copy, read-only)
//	<prefix's directory>/.flyte-staging/<attempt>/out/                (read-write)
//
// made by the executor through the prefix's os.Root, on a path no pod can write: the
// only pod-writable directories are the "out"s, one per attempt, on nobody else's path.
// Once the pod has stopped, CollectOutput moves what it left there (regular files and
// directories; links and devices stay behind and go with the staging directory) to the
// output's URI. URIs through a ".flyte-staging" segment are refused everywhere else.
//
// The input is a copy, never a hard link to the stored object: a pod that got its mount
// writable (a pod template, a runtime's bug) would otherwise rewrite the data store in
// place, and every other attempt's input with it. The copy is bounded as every copy is
// (Limits.MaxCopyBytes) and costs little: copy_file_range clones it where the file
// system can. The tree a pod leaves is bounded too (Limits.MaxOutputEntries and
// MaxOutputDepth): one over a bound is not moved, and the action fails naming it.

// StagingDir is the directory, in each file:// prefix's directory, that holds the
// attempts' staged mounts.
const StagingDir = ".flyte-staging"

// readDirBatch is how many entries of a directory are read at once: a directory of any
// size is held a batch at a time.
const readDirBatch = 256

var attemptID = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$`)

// stagePaths are an attempt's staging directory and its two parts, relative to the
// prefix's directory.
func stagePaths(attempt string) (dir, in, out string, err error) {
	if !attemptID.MatchString(attempt) {
		return "", "", "", fmt.Errorf("datastore: %q cannot name an attempt's staging directory", attempt)
	}
	dir = path.Join(StagingDir, attempt)
	return dir, path.Join(dir, "in"), path.Join(dir, "out"), nil
}

// StageInput implements storage.HostPathStore.
func (v view) StageInput(_ context.Context, uri, attempt string) (storage.HostMount, error) {
	_, in, _, err := stagePaths(attempt)
	if err != nil {
		return storage.HostMount{}, err
	}
	at, root, err := v.hostPlace(uri, false)
	if err != nil {
		return storage.HostMount{}, err
	}
	defer func() { _ = root.Close() }()
	rel := relative(at)
	if err := noLinkOnTheWay(at, root, rel, false); err != nil {
		return storage.HostMount{}, err
	}
	if err := root.MkdirAll(in, 0o755); err != nil {
		return storage.HostMount{}, fileError("staging", at, err)
	}
	staged := path.Join(in, path.Base(rel))
	if err := root.Remove(staged); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return storage.HostMount{}, fileError("staging", at, err)
	}
	if err := v.c.stageCopy(root, at, rel, staged); err != nil {
		return storage.HostMount{}, err
	}
	return storage.HostMount{Source: path.Join(at.under.Path(), staged), Target: path.Join(at.under.Path(), rel)}, nil
}

// stageCopy copies rel to staged, both in root, streamed and bounded as Copy is.
func (c *Confined) stageCopy(root *os.Root, at place, rel, staged string) error {
	in, err := root.OpenFile(rel, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return fileError("staging", at, err)
	}
	defer func() { _ = in.Close() }()
	fi, err := in.Stat()
	if err != nil {
		return fileError("staging", at, err)
	}
	if !fi.Mode().IsRegular() { // checked on the way, but it may have changed since
		return fmt.Errorf("datastore: %s is not a regular file", at.uri)
	}
	out, err := createFile(root, staged)
	if err != nil {
		return fileError("staging", at, err)
	}
	return c.store.stream(at.uri, "its staged copy", in, fi.Size(), out)
}

// StageOutput implements storage.HostPathStore.
func (v view) StageOutput(_ context.Context, uri, attempt string) (storage.HostMount, error) {
	_, _, out, err := stagePaths(attempt)
	if err != nil {
		return storage.HostMount{}, err
	}
	at, root, err := v.hostPlace(uri, true)
	if err != nil {
		return storage.HostMount{}, err
	}
	defer func() { _ = root.Close() }()
	// The output directory is made when it is collected; what exists of its path now
	// must be what Collect will accept.
	if err := noLinkOnTheWay(at, root, relative(at), true); err != nil && !errors.Is(err, storage.ErrNotFound) {
		return storage.HostMount{}, err
	}
	if err := root.MkdirAll(out, 0o755); err != nil {
		return storage.HostMount{}, fileError("staging", at, err)
	}
	return storage.HostMount{Source: path.Join(at.under.Path(), out), Target: path.Join(at.under.Path(), relative(at))}, nil
}

// CollectOutput implements storage.HostPathStore.
func (v view) CollectOutput(_ context.Context, uri, attempt string) error {
	_, _, out, err := stagePaths(attempt)
	if err != nil {
		return err
	}
	at, root, err := v.hostPlace(uri, true)
	if err != nil {
		return err
	}
	defer func() { _ = root.Close() }()
	fi, err := root.Lstat(out)
	if errors.Is(err, fs.ErrNotExist) {
		return nil // collected already, or never staged
	}
	if err != nil {
		return fileError("collecting", at, err)
	}
	if !fi.IsDir() {
		return fileError("collecting", at, root.RemoveAll(out))
	}
	// Measured before anything moves: a tree over a bound is refused whole, the same
	// way however often it is collected, rather than cut.
	if err := measure(root, out, at.uri, v.c.store.limits); errors.Is(err, storage.ErrTooLarge) {
		return err
	} else if err != nil {
		return fileError("collecting", at, err)
	}
	rel := relative(at)
	if rel != "" {
		if err := root.MkdirAll(rel, 0o755); err != nil {
			return fileError("collecting", at, err)
		}
	}
	if err := noLinkOnTheWay(at, root, rel, true); err != nil {
		return err
	}
	if err := move(root, out, orDot(rel)); err != nil {
		return fileError("collecting", at, err)
	}
	return fileError("collecting", at, root.RemoveAll(out))
}

// measure walks the tree under dir, a batch of entries at a time, and fails as soon as
// it holds more entries than limits.MaxOutputEntries or nests directories deeper than
// limits.MaxOutputDepth; uri names the outputs in the error.
func measure(root *os.Root, dir, uri string, limits Limits) error {
	entries := 0
	var walk func(dir string, depth int) error
	walk = func(dir string, depth int) error {
		return eachEntry(root, dir, func(e fs.DirEntry) error {
			if entries++; entries > limits.MaxOutputEntries {
				return tooLarge(uri, -1, int64(limits.MaxOutputEntries), SettingMaxOutputEntries)
			}
			if !e.Type().IsDir() {
				return nil
			}
			if depth+1 > limits.MaxOutputDepth {
				return tooLarge(uri, -1, int64(limits.MaxOutputDepth), SettingMaxOutputDepth)
			}
			return walk(path.Join(dir, e.Name()), depth+1)
		})
	}
	return walk(dir, 0)
}

// eachEntry calls fn with the entries of dir, readDirBatch at a time; their types are
// lstat's (a link is a link). fn may remove the entry it is given.
func eachEntry(root *os.Root, dir string, fn func(fs.DirEntry) error) error {
	d, err := root.Open(dir)
	if err != nil {
		return err
	}
	defer func() { _ = d.Close() }()
	for {
		batch, err := d.ReadDir(readDirBatch)
		for _, e := range batch {
			if err := fn(e); err != nil {
				return err
			}
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// Unstage implements storage.HostPathStore.
func (v view) Unstage(_ context.Context, uri, attempt string) error {
	dir, _, _, err := stagePaths(attempt)
	if err != nil {
		return err
	}
	at, root, err := v.hostPlace(uri, false)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer func() { _ = root.Close() }()
	return fileError("unstaging", at, root.RemoveAll(dir))
}

// move moves the regular files under from to the same places under to, making the
// directories on the way; anything else stays. measure has bounded the tree.
func move(root *os.Root, from, to string) error {
	return eachEntry(root, from, func(e fs.DirEntry) error {
		src, dst := path.Join(from, e.Name()), path.Join(to, e.Name())
		switch {
		case e.Type().IsDir():
			if fi, err := root.Lstat(dst); err == nil && !fi.IsDir() {
				if err := root.RemoveAll(dst); err != nil {
					return err
				}
			}
			if err := root.MkdirAll(dst, 0o755); err != nil {
				return err
			}
			return move(root, src, dst)
		case e.Type().IsRegular():
			if fi, err := root.Lstat(dst); err == nil && !fi.Mode().IsRegular() {
				if err := root.RemoveAll(dst); err != nil {
					return err
				}
			}
			return root.Rename(src, dst)
		}
		return nil
	})
}

// hostPlace checks a file:// URI as a write (dir) or a read, and opens its prefix.
func (v view) hostPlace(uri string, write bool) (place, *os.Root, error) {
	at, err := v.r.check(uri, write)
	if err != nil {
		return place{}, nil, err
	}
	if at.loc.Scheme != "file" {
		return place{}, nil, fmt.Errorf("datastore: %s is not on this machine's disk", uri)
	}
	if at.under.Len() == 0 {
		// A derived view's input: file:// is refused there, so this is not reached.
		return place{}, nil, refuse(uri, storage.ReasonOutside, "not under an allowed prefix")
	}
	root, err := openRoot(at.under, write)
	if err != nil {
		return place{}, nil, fmt.Errorf("datastore: opening %s: %w", at.under, err)
	}
	return at, root, nil
}

// noLinkOnTheWay checks that rel, inside the prefix, is a directory (dir) or a regular
// file reached through directories only: the executor itself follows no link out of the
// data store, and no link leads one project's data into another's.
func noLinkOnTheWay(at place, root *os.Root, rel string, dir bool) error {
	if rel == "" {
		return nil
	}
	parts := strings.Split(rel, "/")
	for i := range parts {
		fi, err := root.Lstat(path.Join(parts[:i+1]...))
		if err != nil {
			return fileError("checking", at, err)
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			return refuse(at.uri, storage.ReasonSymlink, "a symbolic link stands on the way")
		}
		if want := i < len(parts)-1 || dir; want && !fi.IsDir() {
			return fmt.Errorf("datastore: %s: %s is not a directory", at.uri, path.Join(parts[:i+1]...))
		} else if !want && !fi.Mode().IsRegular() {
			return fmt.Errorf("datastore: %s is not a regular file", at.uri)
		}
	}
	return nil
}

func orDot(rel string) string {
	if rel == "" {
		return "."
	}
	return rel
}
