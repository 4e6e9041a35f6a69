package tenancy

// Case is one namespace, project and domain, and whether the default rule lets the
// namespace's actions name that project and domain.
type Case struct {
	Name            string
	Namespace       Namespace
	Project, Domain string
	Allowed         bool
}

// Cases is the table both the executor's rule and the shipped admission policy are
// tested against, so that the two cannot drift apart.
var Cases = []Case{
	{"named after the project", Namespace{Name: "team-a"}, "team-a", "development", true},
	{"another project by name", Namespace{Name: "team-a"}, "team-b", "development", false},
	{"labelled with the project", Namespace{Name: "ml-gpu", Labels: map[string]string{DefaultProjectLabel: "team-a"}}, "team-a", "production", true},
	{"the label wins over the name", Namespace{Name: "team-b", Labels: map[string]string{DefaultProjectLabel: "team-a"}}, "team-b", "development", false},
	{"labelled with another project", Namespace{Name: "ml-gpu", Labels: map[string]string{DefaultProjectLabel: "team-b"}}, "team-a", "development", false},
	{"an empty project label", Namespace{Name: "team-a", Labels: map[string]string{DefaultProjectLabel: ""}}, "team-a", "development", false},
	{"labelled with the domain", Namespace{Name: "team-a-prod", Labels: map[string]string{DefaultProjectLabel: "team-a", DefaultDomainLabel: "production"}}, "team-a", "production", true},
	{"another domain", Namespace{Name: "team-a-prod", Labels: map[string]string{DefaultProjectLabel: "team-a", DefaultDomainLabel: "production"}}, "team-a", "development", false},
	{"a domain label alone", Namespace{Name: "team-a", Labels: map[string]string{DefaultDomainLabel: "production"}}, "team-a", "development", false},
	{"a domain label alone, its domain", Namespace{Name: "team-a", Labels: map[string]string{DefaultDomainLabel: "production"}}, "team-a", "production", true},
	{"unrelated labels", Namespace{Name: "team-a", Labels: map[string]string{"team": "b"}}, "team-b", "development", false},
}
