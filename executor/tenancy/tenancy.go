// Package tenancy ties an action's project and domain to its namespace: a tenant is a
// namespace, and whoever may create TaskActions there acts as that namespace's project
// and no other. The executor writes events and cache entries for every project, so the
// services believe whatever project an action names; this check is what keeps a tenant
// from naming another's.
//
// A namespace's project is the value of its project label, else the one its name is
// made from by the namespace template. The shipped ValidatingAdmissionPolicy
// (deploy/kustomize/base/admission) refuses the same actions at admission, with the
// default settings; the executor checks again, since a cluster can lack the policy.
package tenancy

import (
	"errors"
	"fmt"
	"strings"
)

// Defaults of Rule's fields.
const (
	DefaultProjectLabel      = "flyte.org/project"
	DefaultDomainLabel       = "flyte.org/domain"
	DefaultNamespaceTemplate = ProjectPlaceholder
)

// Placeholders of a namespace template.
const (
	ProjectPlaceholder = "{project}"
	DomainPlaceholder  = "{domain}"
)

// Rule says which projects and domains a namespace's actions may name.
type Rule struct {
	// ProjectLabel, on a namespace, names its project.
	ProjectLabel string
	// DomainLabel, on a namespace, names the one domain its actions may name; without
	// it, any domain of the project.
	DomainLabel string
	// NamespaceTemplate, for a namespace without the project label, makes its name
	// from the project (and domain): the namespace may name the projects and domains
	// whose expansion is its name.
	NamespaceTemplate string
}

// Default is the rule of the default configuration, which the shipped admission policy
// enforces.
func Default() Rule {
	return Rule{ProjectLabel: DefaultProjectLabel, DomainLabel: DefaultDomainLabel, NamespaceTemplate: DefaultNamespaceTemplate}
}

// Validate checks a configured rule.
func (r Rule) Validate() error {
	var errs []error
	if r.ProjectLabel == "" {
		errs = append(errs, errors.New("projectLabel is empty"))
	}
	if r.DomainLabel == "" {
		errs = append(errs, errors.New("domainLabel is empty"))
	}
	if !strings.Contains(r.NamespaceTemplate, ProjectPlaceholder) {
		errs = append(errs, fmt.Errorf("namespaceTemplate %q lacks %s: every project would share one namespace", r.NamespaceTemplate, ProjectPlaceholder))
	}
	rest := strings.NewReplacer(ProjectPlaceholder, "", DomainPlaceholder, "").Replace(r.NamespaceTemplate)
	if strings.ContainsAny(rest, "{}") {
		errs = append(errs, fmt.Errorf("namespaceTemplate %q: only %s and %s may stand in braces", r.NamespaceTemplate, ProjectPlaceholder, DomainPlaceholder))
	}
	return errors.Join(errs...)
}

// Namespace is what the rule reads of a namespace.
type Namespace struct {
	Name   string
	Labels map[string]string
}

// RefusedError says why a namespace may not name a project and domain.
type RefusedError struct {
	Namespace, Project, Domain string
	// Why names what the namespace belongs to, and by which rule.
	Why string
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("namespace %q may not run actions of project %q, domain %q: %s", e.Namespace, e.Project, e.Domain, e.Why)
}

// Check returns a *RefusedError when actions of ns may not name project and domain.
func (r Rule) Check(ns Namespace, project, domain string) error {
	refuse := func(format string, args ...any) error {
		return &RefusedError{Namespace: ns.Name, Project: project, Domain: domain, Why: fmt.Sprintf(format, args...)}
	}
	if want, ok := ns.Labels[r.DomainLabel]; ok && want != domain {
		return refuse("its label %s holds domain %q", r.DomainLabel, want)
	}
	if want, ok := ns.Labels[r.ProjectLabel]; ok {
		if want != project {
			return refuse("its label %s names project %q", r.ProjectLabel, want)
		}
		return nil
	}
	if want := r.expand(project, domain); want != ns.Name {
		return refuse("it has no label %s, so its name must be %s, %q for this project and domain", r.ProjectLabel, r.NamespaceTemplate, want)
	}
	return nil
}

func (r Rule) expand(project, domain string) string {
	return strings.NewReplacer(ProjectPlaceholder, project, DomainPlaceholder, domain).Replace(r.NamespaceTemplate)
}
