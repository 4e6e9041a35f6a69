package tenancy_test

import (
	"errors"
	"testing"

	"github.com/flytekube/backend/executor/tenancy"
)

func TestCheck(t *testing.T) {
	for _, c := range tenancy.Cases {
		t.Run(c.Name, func(t *testing.T) {
			err := tenancy.Default().Check(c.Namespace, c.Project, c.Domain)
			if allowed := err == nil; allowed != c.Allowed {
				t.Fatalf("Check(%+v, %q, %q) = %v, want allowed=%v", c.Namespace, c.Project, c.Domain, err, c.Allowed)
			}
			var refused *tenancy.RefusedError
			if err != nil && !errors.As(err, &refused) {
				t.Fatalf("Check returned %T, want *RefusedError", err)
			}
		})
	}
}

func TestCheckWithATemplateOfProjectAndDomain(t *testing.T) {
	r := tenancy.Default()
	r.NamespaceTemplate = "{project}-{domain}"
	for _, c := range []struct {
		ns, project, domain string
		allowed             bool
	}{
		{"team-a-development", "team-a", "development", true},
		{"team-a-development", "team-a", "production", false},
		{"team-a", "team-a", "development", false},
	} {
		if err := r.Check(tenancy.Namespace{Name: c.ns}, c.project, c.domain); (err == nil) != c.allowed {
			t.Errorf("Check(%q, %q, %q) = %v, want allowed=%v", c.ns, c.project, c.domain, err, c.allowed)
		}
	}
}

func TestValidate(t *testing.T) {
	for _, c := range []struct {
		name string
		rule tenancy.Rule
		ok   bool
	}{
		{"default", tenancy.Default(), true},
		{"project and domain", tenancy.Rule{ProjectLabel: "p", DomainLabel: "d", NamespaceTemplate: "flyte-{project}-{domain}"}, true},
		{"no project in the template", tenancy.Rule{ProjectLabel: "p", DomainLabel: "d", NamespaceTemplate: "shared"}, false},
		{"unknown placeholder", tenancy.Rule{ProjectLabel: "p", DomainLabel: "d", NamespaceTemplate: "{project}-{team}"}, false},
		{"no labels", tenancy.Rule{NamespaceTemplate: "{project}"}, false},
	} {
		if err := c.rule.Validate(); (err == nil) != c.ok {
			t.Errorf("%s: Validate() = %v, want ok=%v", c.name, err, c.ok)
		}
	}
}
