// Command dashboard writes the Grafana dashboard of package deploy/dashboard to the
// file it is given; `make generate` runs it.
package main

import (
	"fmt"
	"os"

	"github.com/flytekube/backend/deploy/dashboard"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: dashboard OUT.json")
		os.Exit(2)
	}
	out, err := dashboard.JSON()
	if err == nil {
		err = os.WriteFile(os.Args[1], out, 0o644)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
