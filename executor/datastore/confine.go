package datastore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path"
	"slices"
	"strings"
	"syscall"

	"gocloud.dev/blob"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/datastore/prefix"
	"github.com/flytekube/backend/executor/storage"
)

// Setting is the configuration key of the allowed prefixes, named in refusals so that
// whoever reads one knows what to change.
const Setting = "storage.allowedPrefixes"

// Confined is a Store that reads and writes only under allowed prefixes, and gives each
// action a view limited further to its own project's and domain's part of them.
//
// file:// objects are read and written through an os.Root opened at their prefix's
// directory, so that neither ".." nor a symbolic link planted inside can lead out of it.
type Confined struct {
	store    *Store
	prefixes []prefix.Prefix
}

var (
	_ storage.DataStore             = (*Confined)(nil)
	_ storage.ActionScopedDataStore = (*Confined)(nil)
	_ storage.HostPathStore         = view{}
	_ storage.Checker               = (*Confined)(nil)
	_ storage.Checker               = view{}
	_ storage.Copier                = (*Confined)(nil)
	_ storage.Copier                = view{}
)

// Confine limits s to the allowed prefixes (see package prefix for their form). With
// none, nothing is allowed but what each action's view derives from the action itself:
// reading its inputUri and reading and writing under its runOutputBase, and never on
// file://, which a prefix must name explicitly.
func Confine(s *Store, allowed []string) (*Confined, error) {
	c := &Confined{store: s}
	var errs []error
	for i, raw := range allowed {
		p, err := prefix.Parse(raw)
		if err != nil {
			errs = append(errs, fmt.Errorf("allowed prefix %d: %w", i, err))
			continue
		}
		c.prefixes = append(c.prefixes, p)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("datastore: %w", err)
	}
	return c, nil
}

// Read implements storage.DataStore, under any allowed prefix, with placeholders standing
// for any project and domain.
func (c *Confined) Read(ctx context.Context, uri string) ([]byte, error) {
	return c.read(ctx, c.rules(), uri)
}

// Write implements storage.DataStore, as Read.
func (c *Confined) Write(ctx context.Context, uri string, content []byte) error {
	return c.write(ctx, c.rules(), uri, content)
}

// Exists implements storage.DataStore, as Read.
func (c *Confined) Exists(ctx context.Context, uri string) (bool, error) {
	return c.exists(ctx, c.rules(), uri)
}

// Size implements storage.Sizer, as Read.
func (c *Confined) Size(ctx context.Context, uri string) (int64, error) {
	return c.size(ctx, c.rules(), uri)
}

// Copy implements storage.Copier, as Read for from and Write for to.
func (c *Confined) Copy(ctx context.Context, from, to string) error {
	return c.copy(ctx, c.rules(), from, to)
}

// Check implements storage.Checker, as Read.
func (c *Confined) Check(uri string, write bool) error {
	_, err := c.rules().check(uri, write)
	return err
}

// Close closes the underlying store.
func (c *Confined) Close() error { return c.store.Close() }

func (c *Confined) rules() rules {
	if len(c.prefixes) == 0 {
		return rules{none: Setting + " is empty, so only actions' own locations may be used"}
	}
	return rules{allowed: c.prefixes}
}

// ForAction implements storage.ActionScopedDataStore: the part of the store the action may
// use. With prefixes configured, it is their expansion for the action's project and
// domain; another project's or domain's part of a templated prefix is refused even where
// a plain prefix covers it. With none, it is derived from the action (see Confine).
func (c *Confined) ForAction(ta *flytev1.TaskAction) storage.DataStore {
	r := rules{scoped: true, project: ta.Spec.Project, domain: ta.Spec.Domain}
	if len(c.prefixes) == 0 {
		r.none = "outside the action's inputs and output base"
		// The action's own file:// locations are remembered only to say why they are
		// refused: their cause is the configuration, not the action.
		if loc, err := prefix.ParseURI(ta.Spec.InputURI); err == nil && loc.Scheme != "file" {
			r.input = &loc
		} else if err == nil {
			r.fileInput = &loc
		}
		if p, err := prefix.ParseLiteral(ta.Spec.RunOutputBase); err == nil && p.Scheme() != "file" {
			r.allowed = []prefix.Prefix{p}
		} else if err == nil {
			r.fileBase = &p
		}
		return view{c, r}
	}
	for _, p := range c.prefixes {
		if !p.Templated() {
			r.allowed = append(r.allowed, p)
			continue
		}
		r.territories = append(r.territories, p)
		// A project or domain that cannot be a path segment gets no part of it.
		if e, err := p.Expand(ta.Spec.Project, ta.Spec.Domain); err == nil {
			r.allowed = append(r.allowed, e)
		}
	}
	return view{c, r}
}

// view is one action's part of a confined store.
type view struct {
	c *Confined
	r rules
}

func (v view) Read(ctx context.Context, uri string) ([]byte, error) { return v.c.read(ctx, v.r, uri) }
func (v view) Write(ctx context.Context, uri string, content []byte) error {
	return v.c.write(ctx, v.r, uri, content)
}
func (v view) Exists(ctx context.Context, uri string) (bool, error) {
	return v.c.exists(ctx, v.r, uri)
}
func (v view) Size(ctx context.Context, uri string) (int64, error) { return v.c.size(ctx, v.r, uri) }
func (v view) Copy(ctx context.Context, from, to string) error {
	return v.c.copy(ctx, v.r, from, to)
}

// Check implements storage.Checker.
func (v view) Check(uri string, write bool) error {
	_, err := v.r.check(uri, write)
	return err
}

// rules say which URIs may be used.
type rules struct {
	// allowed are the prefixes to read and write under; templated ones (outside a
	// view) match any project and domain.
	allowed []prefix.Prefix
	// input is an object that may be read, but not written: a derived view's inputs.
	input *prefix.Location
	// scoped views belong to an action of project and domain; territories are the
	// templated prefixes whose other projects' and domains' parts are refused.
	scoped          bool
	project, domain string
	territories     []prefix.Prefix
	// none explains a refusal when no prefix matched.
	none string
	// fileBase and fileInput are a derived view's own file:// output base and input,
	// refused for want of a prefix naming them.
	fileBase  *prefix.Prefix
	fileInput *prefix.Location
}

// place is where an allowed URI lies: its object, and the concrete prefix holding it
// (with no placeholders; the zero Prefix for a derived view's inputs).
type place struct {
	uri   string
	loc   prefix.Location
	under prefix.Prefix
}

func refuse(uri, reason, why string) error {
	return &storage.NotAllowedError{URI: uri, Reason: reason, Why: why}
}

// check decides whether uri may be used, and where it lies.
func (r rules) check(uri string, write bool) (place, error) {
	loc, err := prefix.ParseURI(uri)
	if err != nil {
		return place{}, refuse(uri, storage.ReasonOutside, strings.TrimPrefix(err.Error(), fmt.Sprintf("%q", uri)+": "))
	}
	if slices.Contains(loc.Segments, StagingDir) {
		return place{}, refuse(uri, storage.ReasonReserved, StagingDir+" directories are the executor's own: it stages pods' mounts there")
	}
	for _, t := range r.territories {
		vars, ok := t.Claim(loc)
		if ok && (vars.Project != "" && vars.Project != r.project || vars.Domain != "" && vars.Domain != r.domain) {
			return place{}, refuse(uri, storage.ReasonOtherProject,
				fmt.Sprintf("in the part of %s of project %q, domain %q; the action is of project %q, domain %q", t, vars.Project, vars.Domain, r.project, r.domain))
		}
	}
	if !write && r.input != nil && loc.String() == r.input.String() {
		return place{uri: uri, loc: loc}, nil
	}
	best, found := prefix.Prefix{}, false
	for _, p := range r.allowed {
		vars, ok := p.Match(loc)
		if !ok {
			continue
		}
		if p.Templated() { // outside a view: the part of the project and domain matched
			if p, err = p.Expand(vars.Project, vars.Domain); err != nil {
				continue
			}
		}
		// The longest prefix wins: for file://, the tightest directory is the root.
		if !found || p.Len() > best.Len() {
			best, found = p, true
		}
	}
	if !found {
		if r.ownFile(loc, write) {
			return place{}, refuse(uri, storage.ReasonFileNotConfigured, fmt.Sprintf(
				"file:// is refused unless the executor's %s lists a prefix holding it, and it lists none: add one (such as file:///data/) to use the disk",
				Setting))
		}
		why := r.none
		if why == "" {
			why = "under none of the allowed prefixes (" + Setting + ")"
		}
		return place{}, refuse(uri, storage.ReasonOutside, why)
	}
	return place{uri: uri, loc: loc, under: best}, nil
}

// ownFile reports whether loc is one of a derived view's own file:// locations.
func (r rules) ownFile(loc prefix.Location, write bool) bool {
	if r.fileBase != nil {
		if _, ok := r.fileBase.Match(loc); ok {
			return true
		}
	}
	return !write && r.fileInput != nil && loc.String() == r.fileInput.String()
}

func (c *Confined) read(ctx context.Context, r rules, uri string) ([]byte, error) {
	at, err := r.check(uri, false)
	if err != nil {
		return nil, err
	}
	if at.loc.Scheme != "file" {
		return c.store.read(ctx, bucketURL(at.loc), at.loc.Key(), uri)
	}
	f, size, err := openFile(at, "reading")
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	data, err := readLimited(f, size, c.store.limits.MaxDocumentBytes, uri)
	if err != nil && !errors.Is(err, storage.ErrTooLarge) {
		return nil, fileError("reading", at, err)
	}
	return data, err
}

// openFile opens a file:// object for reading, and tells its size. Only a regular file
// is data: a named pipe a task left would block a reader for ever, so it is opened
// without waiting and refused.
func openFile(at place, op string) (*os.File, int64, error) {
	root, err := openRoot(at.under, false)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, 0, fmt.Errorf("datastore: %s %s: %w", op, at.uri, storage.ErrNotFound)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("datastore: %s %s: %w", op, at.uri, err)
	}
	defer func() { _ = root.Close() }() // the file stays open without it
	f, err := root.OpenFile(relative(at), os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, 0, fileError(op, at, err)
	}
	fi, err := f.Stat()
	if err == nil && !fi.Mode().IsRegular() {
		err = fmt.Errorf("datastore: %s %s: not a regular file", op, at.uri)
	}
	if err != nil {
		_ = f.Close()
		return nil, 0, fileError(op, at, err)
	}
	return f, fi.Size(), nil
}

func (c *Confined) write(ctx context.Context, r rules, uri string, content []byte) error {
	at, err := r.check(uri, true)
	if err != nil {
		return err
	}
	if at.loc.Scheme != "file" {
		return c.store.write(ctx, bucketURL(at.loc), at.loc.Key(), uri, content)
	}
	root, err := openRoot(at.under, true)
	if err != nil {
		return fmt.Errorf("datastore: writing %s: %w", uri, err)
	}
	defer func() { _ = root.Close() }()
	return fileError("writing", at, writeFile(root, relative(at), content))
}

func (c *Confined) copy(ctx context.Context, r rules, from, to string) error {
	src, err := r.check(from, false)
	if err != nil {
		return err
	}
	dst, err := r.check(to, true)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, c.store.limits.CopyTimeout)
	defer cancel()
	var (
		in   io.ReadCloser
		size int64
	)
	if src.loc.Scheme == "file" {
		in, size, err = openFile(src, "copying")
	} else {
		var br *blob.Reader
		br, err = c.store.openBlob(ctx, bucketURL(src.loc), src.loc.Key(), from, "copying")
		if err == nil {
			in, size = br, br.Size()
		}
	}
	if err != nil {
		return err
	}
	defer func() { _ = in.Close() }()
	var out sink
	if dst.loc.Scheme == "file" {
		root, err := openRoot(dst.under, true)
		if err != nil {
			return fmt.Errorf("datastore: writing %s: %w", to, err)
		}
		defer func() { _ = root.Close() }()
		if out, err = createFile(root, relative(dst)); err != nil {
			return fileError("writing", dst, err)
		}
	} else if out, err = c.store.createBlob(ctx, bucketURL(dst.loc), dst.loc.Key(), to); err != nil {
		return err
	}
	return c.store.stream(from, to, in, size, out)
}

func (c *Confined) exists(ctx context.Context, r rules, uri string) (bool, error) {
	at, err := r.check(uri, false)
	if err != nil {
		return false, err
	}
	if at.loc.Scheme != "file" {
		return c.store.exists(ctx, bucketURL(at.loc), at.loc.Key(), uri)
	}
	root, err := openRoot(at.under, false)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("datastore: checking %s: %w", uri, err)
	}
	defer func() { _ = root.Close() }()
	fi, err := root.Stat(relative(at))
	if err = fileError("checking", at, err); errors.Is(err, storage.ErrNotFound) {
		return false, nil
	}
	return err == nil && fi.Mode().IsRegular(), err
}

func (c *Confined) size(ctx context.Context, r rules, uri string) (int64, error) {
	at, err := r.check(uri, false)
	if err != nil {
		return 0, err
	}
	if at.loc.Scheme != "file" {
		return c.store.size(ctx, bucketURL(at.loc), at.loc.Key(), uri)
	}
	root, err := openRoot(at.under, false)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, fmt.Errorf("datastore: sizing %s: %w", uri, storage.ErrNotFound)
	}
	if err != nil {
		return 0, fmt.Errorf("datastore: sizing %s: %w", uri, err)
	}
	defer func() { _ = root.Close() }()
	fi, err := root.Stat(relative(at))
	if err = fileError("sizing", at, err); err != nil {
		return 0, err
	}
	return fi.Size(), nil
}

func bucketURL(loc prefix.Location) string { return loc.Scheme + "://" + loc.Host }

// relative is the object's path within its prefix's directory.
func relative(at place) string { return path.Join(at.loc.Segments[at.under.Len():]...) }

// openRoot opens a file:// prefix's directory, creating it for a write. A root is opened
// per call rather than kept: a kept one would go on writing into a directory that was
// removed and created again.
func openRoot(p prefix.Prefix, create bool) (*os.Root, error) {
	root, err := os.OpenRoot(p.Path())
	if errors.Is(err, fs.ErrNotExist) && create {
		if err := os.MkdirAll(p.Path(), 0o755); err != nil {
			return nil, err
		}
		root, err = os.OpenRoot(p.Path())
	}
	return root, err
}

// writeFile replaces name's content at once: a reader sees the old file or the new,
// never part of one.
func writeFile(root *os.Root, name string, content []byte) error {
	f, err := createFile(root, name)
	if err != nil {
		return err
	}
	if _, err := f.Write(content); err != nil {
		f.abort()
		return err
	}
	return f.commit()
}

// fileSink writes a file:// object into a temporary file beside it, renamed over it on
// commit. It is an *os.File, so that a copy from another reaches the kernel's
// copy_file_range (a reflink where the file system has them).
type fileSink struct {
	*os.File
	root      *os.Root
	tmp, name string
}

// createFile starts replacing name in root, making the directories on its way.
func createFile(root *os.Root, name string) (*fileSink, error) {
	if dir := path.Dir(name); dir != "." {
		if err := root.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
	}
	tmp := path.Join(path.Dir(name), fmt.Sprintf(".%s.%016x.tmp", path.Base(name), rand.Uint64()))
	f, err := root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return nil, err
	}
	return &fileSink{File: f, root: root, tmp: tmp, name: name}, nil
}

func (f *fileSink) commit() error {
	err := f.Close()
	if err == nil {
		err = f.root.Rename(f.tmp, f.name)
	}
	if err != nil {
		_ = f.root.Remove(f.tmp)
	}
	return err
}

func (f *fileSink) abort() {
	_ = f.Close()
	_ = f.root.Remove(f.tmp)
}

// fileError classifies an error of os.Root: a missing file is ErrNotFound, and a path
// that a symbolic link leads out of the prefix is not allowed.
func fileError(op string, at place, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR):
		return fmt.Errorf("datastore: %s %s: %w", op, at.uri, storage.ErrNotFound)
	case escapes(err):
		return refuse(at.uri, storage.ReasonSymlink, fmt.Sprintf("a symbolic link leads out of %s", at.under))
	default:
		return fmt.Errorf("datastore: %s %s: %w", op, at.uri, err)
	}
}

// escapes recognizes os.Root's refusal to leave its directory, whose error the os
// package does not export; TestConfinedRefusesEverythingOutsideItsPrefixes pins it.
func escapes(err error) bool { return strings.Contains(err.Error(), "path escapes from parent") }
