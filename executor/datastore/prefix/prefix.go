// Package prefix decides which blob URIs lie under which storage prefixes, so that the
// executor's data store reads and writes only where it is allowed to.
//
// URIs are compared by scheme, bucket and whole path segments, after decoding them once
// as the storage drivers do. A URI whose meaning could differ between this check and the
// storage serving it (dot segments, encoded slashes, empty segments, a query, a port) is
// refused rather than normalized: a check that cleans "a/../b" may not agree with a
// driver that does not.
package prefix

import (
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strings"
)

// Placeholders a prefix may hold as whole path segments; Expand fills them with an
// action's project and domain, so that one entry gives each project its own part.
const (
	Project = "{project}"
	Domain  = "{domain}"
)

// systemDirs may never lie under a file:// prefix, nor hold one: they hold the process's
// credentials (/var/run/secrets), its memory and devices, the node's configuration and
// programs, and the node's own state: the kubelet's pods and volumes (their Secrets),
// etcd's data, the container runtimes' images and snapshots, and pods' logs.
var systemDirs = []string{"/proc", "/sys", "/dev", "/etc", "/run", "/var/run", "/boot", "/root",
	"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64",
	"/var/lib/kubelet", "/var/lib/etcd", "/var/lib/containerd", "/var/lib/docker", "/var/lib/cni", "/opt/cni",
	"/var/log"}

// Location is a parsed blob URI.
type Location struct {
	Scheme string
	// Host is the bucket; empty for file:// URIs.
	Host string
	// Segments are the decoded path segments.
	Segments []string
}

// Key is the object's key within its bucket (for file://, the path without its leading
// slash).
func (l Location) Key() string { return strings.Join(l.Segments, "/") }

// String is the URI in canonical form.
func (l Location) String() string { return l.Scheme + "://" + l.Host + "/" + l.Key() }

// ParseURI parses the URI of an object, refusing any form that two readers could take
// to mean different objects.
func ParseURI(raw string) (Location, error) {
	loc, err := parse(raw)
	if err != nil {
		return Location{}, err
	}
	if len(loc.Segments) == 0 {
		return Location{}, fmt.Errorf("%q names no object", raw)
	}
	for _, s := range loc.Segments {
		if s == "" {
			return Location{}, fmt.Errorf("%q has an empty path segment", raw)
		}
	}
	return loc, nil
}

// parse checks what objects and prefixes share and splits the path; the segments may
// include empty ones, for the callers to judge.
func parse(raw string) (Location, error) {
	if strings.ContainsFunc(raw, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		return Location{}, fmt.Errorf("%q contains a control character", raw)
	}
	u, err := url.Parse(raw)
	if err != nil {
		return Location{}, fmt.Errorf("%q is not a URI: %w", raw, errors.Unwrap(err))
	}
	if u.Scheme == "" || u.Opaque != "" {
		return Location{}, fmt.Errorf("%q is not an absolute URI such as s3://bucket/path", raw)
	}
	switch {
	case u.User != nil:
		return Location{}, fmt.Errorf("%q carries user information", raw)
	case u.RawQuery != "" || u.ForceQuery:
		return Location{}, fmt.Errorf("%q carries a query", raw)
	case u.Fragment != "" || strings.Contains(raw, "#"):
		return Location{}, fmt.Errorf("%q carries a fragment", raw)
	case u.Port() != "" || strings.HasSuffix(u.Host, ":"):
		return Location{}, fmt.Errorf("%q names a port", raw)
	}
	// The drivers decode the path once; an encoded separator would become a separator
	// there but not here.
	if escaped := strings.ToLower(u.EscapedPath()); strings.Contains(escaped, "%2f") || strings.Contains(escaped, "%5c") {
		return Location{}, fmt.Errorf("%q contains an encoded slash", raw)
	}
	if strings.ContainsFunc(u.Path, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		return Location{}, fmt.Errorf("%q contains an encoded control character", raw)
	}
	if u.Scheme == "file" {
		if u.Host != "" {
			return Location{}, fmt.Errorf("%q: file URIs have no host; write file:///path", raw)
		}
	} else if u.Host == "" {
		return Location{}, fmt.Errorf("%q needs a bucket, as in %s://bucket/path", raw, u.Scheme)
	}
	loc := Location{Scheme: u.Scheme, Host: u.Host}
	if p := strings.TrimPrefix(u.Path, "/"); p != "" {
		loc.Segments = strings.Split(p, "/")
	}
	for _, s := range loc.Segments {
		if s == "." || s == ".." {
			return Location{}, fmt.Errorf("%q has a %q or %q path segment", raw, ".", "..")
		}
	}
	return loc, nil
}

// segment is one path segment of a prefix: literal text or a placeholder.
type segment struct {
	text        string
	placeholder bool
}

// Prefix is a location under which objects may be read and written.
type Prefix struct {
	scheme, host string
	segments     []segment
}

// Parse parses a configured prefix: an absolute URI of a bucket or a directory, whose
// path segments may be the placeholders {project} and {domain}.
func Parse(raw string) (Prefix, error) { return parsePrefix(raw, true) }

// ParseLiteral parses a prefix with no placeholders, such as an action's own output
// base: braces in it are plain characters.
func ParseLiteral(raw string) (Prefix, error) { return parsePrefix(raw, false) }

func parsePrefix(raw string, templated bool) (Prefix, error) {
	loc, err := parse(raw)
	if err != nil {
		return Prefix{}, err
	}
	// One trailing slash is the usual way to write a directory.
	if n := len(loc.Segments); n > 0 && loc.Segments[n-1] == "" {
		loc.Segments = loc.Segments[:n-1]
	}
	p := Prefix{scheme: loc.Scheme, host: loc.Host}
	for _, s := range loc.Segments {
		switch {
		case s == "":
			return Prefix{}, fmt.Errorf("%q has an empty path segment", raw)
		case !templated:
			p.segments = append(p.segments, segment{text: s})
		case s == Project || s == Domain:
			p.segments = append(p.segments, segment{text: s, placeholder: true})
		case strings.ContainsAny(s, "{}"):
			if m := placeholderLike.FindString(s); m != "" && m != Project && m != Domain {
				return Prefix{}, fmt.Errorf("%q: unknown placeholder %s; the placeholders are %s and %s", raw, m, Project, Domain)
			}
			return Prefix{}, fmt.Errorf("%q: placeholders must be whole path segments, as in s3://bucket/%s/%s/", raw, Project, Domain)
		default:
			p.segments = append(p.segments, segment{text: s})
		}
	}
	if p.scheme == "file" {
		if err := checkFileDir("/"+strings.Join(p.texts(), "/"), raw); err != nil {
			return Prefix{}, err
		}
	}
	return p, nil
}

var placeholderLike = regexp.MustCompile(`\{[^{}/]*\}`)

// checkFileDir refuses file:// prefixes that would open the executor's own disk at large.
func checkFileDir(dir, raw string) error {
	if dir == "/" {
		return fmt.Errorf("%q opens the whole file system; name a directory that holds only task data", raw)
	}
	for _, sys := range systemDirs {
		if dir == sys || strings.HasPrefix(dir, sys+"/") || strings.HasPrefix(sys, dir+"/") {
			return fmt.Errorf("%q: the system directory %s must not be readable through the data store", raw, sys)
		}
	}
	return nil
}

func (p Prefix) texts() []string {
	out := make([]string, len(p.segments))
	for i, s := range p.segments {
		out[i] = s.text
	}
	return out
}

// String is the prefix in canonical form, ending in a slash.
func (p Prefix) String() string {
	path := strings.Join(p.texts(), "/")
	if path != "" {
		path += "/"
	}
	return p.scheme + "://" + p.host + "/" + path
}

// Scheme is the prefix's URI scheme, such as "s3" or "file".
func (p Prefix) Scheme() string { return p.scheme }

// Len is the number of path segments of the prefix.
func (p Prefix) Len() int { return len(p.segments) }

// Templated reports whether the prefix holds placeholders.
func (p Prefix) Templated() bool {
	return slices.ContainsFunc(p.segments, func(s segment) bool { return s.placeholder })
}

// Path is a file:// prefix's directory.
func (p Prefix) Path() string { return "/" + strings.Join(p.texts(), "/") }

// Vars are the values a templated prefix's placeholders took in a match.
type Vars struct {
	Project, Domain string
}

// Match reports whether loc lies strictly under p (the prefix itself is no object under
// it), with the values its placeholders matched; a placeholder matches one segment.
func (p Prefix) Match(loc Location) (Vars, bool) {
	if loc.Scheme != p.scheme || loc.Host != p.host || len(loc.Segments) <= len(p.segments) {
		return Vars{}, false
	}
	return p.bind(loc.Segments)
}

// Claim reports whether loc lies on a path the template p gives some project or domain,
// at any depth: under p, or on the way to it (p's literal segments match as far as loc
// goes and at least one placeholder is reached). vars holds the placeholders reached.
// A plain prefix covering a templated one must refuse such a path of another project:
// /data/projects/b/notes.json is project b's under /data/projects/{project}/{domain},
// though nothing of the template lies strictly above it.
func (p Prefix) Claim(loc Location) (Vars, bool) {
	if loc.Scheme != p.scheme || loc.Host != p.host {
		return Vars{}, false
	}
	n := min(len(loc.Segments), len(p.segments))
	vars, ok := p.bind(loc.Segments[:n])
	reached := slices.ContainsFunc(p.segments[:n], func(s segment) bool { return s.placeholder })
	return vars, ok && reached
}

// bind matches segs against p's first len(segs) segments, literal for literal, and
// returns what the placeholders among them took (each one value throughout).
func (p Prefix) bind(segs []string) (Vars, bool) {
	var vars Vars
	for i, got := range segs[:min(len(segs), len(p.segments))] {
		s := p.segments[i]
		switch {
		case !s.placeholder:
			if got != s.text {
				return Vars{}, false
			}
		case s.text == Project:
			if vars.Project != "" && vars.Project != got {
				return Vars{}, false
			}
			vars.Project = got
		case s.text == Domain:
			if vars.Domain != "" && vars.Domain != got {
				return Vars{}, false
			}
			vars.Domain = got
		}
	}
	return vars, true
}

// Has reports whether the prefix holds a placeholder, Project or Domain.
func (p Prefix) Has(placeholder string) bool {
	return slices.Contains(p.segments, segment{text: placeholder, placeholder: true})
}

// Expand fills the placeholders with a project and a domain, each of which must be one
// plain path segment (a value whose placeholder the prefix lacks is ignored).
func (p Prefix) Expand(project, domain string) (Prefix, error) {
	for _, v := range []struct{ placeholder, value string }{{Project, project}, {Domain, domain}} {
		if p.Has(v.placeholder) && (!validValue.MatchString(v.value) || v.value == "." || v.value == "..") {
			return Prefix{}, fmt.Errorf("%q cannot fill %s in %s", v.value, v.placeholder, p)
		}
	}
	out := Prefix{scheme: p.scheme, host: p.host, segments: make([]segment, len(p.segments))}
	for i, s := range p.segments {
		switch {
		case !s.placeholder:
			out.segments[i] = s
		case s.text == Project:
			out.segments[i] = segment{text: project}
		default:
			out.segments[i] = segment{text: domain}
		}
	}
	return out, nil
}

// validValue is what a project or domain may be to fill a placeholder: the TaskAction
// schema allows less (DNS labels), and nothing here may add a separator or an escape.
var validValue = regexp.MustCompile(`^[A-Za-z0-9._-]+$`)
