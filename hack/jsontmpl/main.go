// Command jsontmpl prints the JSON document on its standard input through a Go template,
// as `go list -f` does for packages: the hack/ scripts read `go mod edit -json`, which
// has no -f of its own, with it.
//
// Usage: go mod edit -json go.mod | go run ./hack/jsontmpl '{{range .Require}}{{.Path}} {{end}}'
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"text/template"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: jsontmpl TEMPLATE < document.json")
		os.Exit(2)
	}
	if err := run(os.Args[1]); err != nil {
		fmt.Fprintln(os.Stderr, "jsontmpl:", err)
		os.Exit(1)
	}
}

func run(text string) error {
	tmpl, err := template.New("jsontmpl").Parse(text)
	if err != nil {
		return err
	}
	var doc any
	if err := json.NewDecoder(os.Stdin).Decode(&doc); err != nil {
		return fmt.Errorf("reading the JSON document: %w", err)
	}
	return tmpl.Execute(os.Stdout, doc)
}
