// Command devcreds makes, or keeps, the credentials the services run with under docker
// compose (see services/auth/devcreds): compose runs it once, before the services, into the
// volume they read. It prints where the files are and how to call a service with them.
//
//	devcreds --dir /home/nonroot --host events --host cacheservice
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/flytekube/backend/services/auth/devcreds"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("devcreds", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir, hosts := devcreds.Flags(fs)
	if err := fs.Parse(args); errors.Is(err, flag.ErrHelp) {
		return 0
	} else if err != nil {
		return 2
	}
	if *dir == "" || fs.NArg() != 0 {
		fmt.Fprintln(stderr, "usage: devcreds --dir DIR [--host NAME]...")
		return 2
	}
	c, err := devcreds.Ensure(*dir, *hosts...)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	if len(c.Generated) == 0 {
		fmt.Fprintf(stdout, "credentials in %s are still good: kept\n", c.Dir)
	} else {
		fmt.Fprintf(stdout, "wrote %s in %s\n", strings.Join(c.Generated, ", "), c.Dir)
	}
	fmt.Fprintf(stdout, "trust %s; send the token of %s (read only), %s (the CloudEvents egress) or %s (everything) as \"Authorization: Bearer <token>\"\n",
		filepath.Base(c.CAFile), filepath.Base(c.ViewerTokenFile), filepath.Base(c.OperatorTokenFile), filepath.Base(c.ExecutorTokenFile))
	return 0
}
