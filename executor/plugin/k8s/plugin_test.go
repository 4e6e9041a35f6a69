package k8s

import (
	"testing"
	"text/template"
)

func TestLinksKeepOnlyAbsoluteURIs(t *testing.T) {
	parse := func(name, text string) LogLinkTemplate {
		return LogLinkTemplate{Name: name, Template: template.Must(template.New(name).Option("missingkey=error").Parse(text))}
	}
	cfg := Config{LogLinks: []LogLinkTemplate{
		parse("good", "https://logs.example.com/{{.Namespace}}/{{.PodName}}"),
		parse("relative", "{{.PodName}}"),
		parse("spaces", "https://logs.example.com/{{.Project}} {{.Action}}"),
	}}
	got := cfg.Links(LogLinkData{Namespace: "demo", PodName: "a0-1", Project: "p", Action: "a0"})
	if len(got) != 1 || got[0].Name != "good" || got[0].URI != "https://logs.example.com/demo/a0-1" {
		t.Fatalf("links %+v; want only the absolute one", got)
	}
}
