package deploy_test

// The binaries' flags, as each registers them: docker compose's commands and health
// checks and the manifests' arguments are parsed with them.

import (
	"flag"
	"fmt"
	"io"

	"github.com/flytekube/backend/cacheservice"
	"github.com/flytekube/backend/events"
	"github.com/flytekube/backend/executor"
	"github.com/flytekube/backend/internal/healthcheck"
	"github.com/flytekube/backend/services/auth/devcreds"
)

// flagSets register the flags of each binary the Dockerfiles build, by package.
var flagSets = map[string]func(fs *flag.FlagSet){
	"./events/cmd/events":             func(fs *flag.FlagSet) { events.Flags(fs, &events.Config{}) },
	"./cacheservice/cmd/cacheservice": func(fs *flag.FlagSet) { cacheservice.Flags(fs, &cacheservice.Config{}) },
	"./executor/cmd/executor":         func(fs *flag.FlagSet) { executor.Flags(fs) },
	"./deploy/docker/healthcheck":     func(fs *flag.FlagSet) { healthcheck.Flags(fs) },
	"./deploy/docker/devcreds":        func(fs *flag.FlagSet) { devcreds.Flags(fs) },
}

// parsedFlags is what a command line says: every flag's value, given or default, as
// written (the last one given of a repeatable flag), every value given of each flag, in
// order, and the arguments after the flags.
type parsedFlags struct {
	values map[string]string
	given  map[string][]string
	args   []string
}

// parseFlags parses a command line as the binary built from pkg does.
func parseFlags(pkg string, args []string) (parsedFlags, error) {
	register := flagSets[pkg]
	if register == nil {
		return parsedFlags{}, fmt.Errorf("teach this test the flags of %s (flagSets)", pkg)
	}
	fs := flag.NewFlagSet(pkg, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	register(fs)
	p := parsedFlags{values: map[string]string{}, given: map[string][]string{}}
	fs.VisitAll(func(f *flag.Flag) {
		p.values[f.Name] = f.DefValue
		f.Value = recorder{f.Value, func(v string) {
			p.values[f.Name] = v
			p.given[f.Name] = append(p.given[f.Name], v)
		}}
	})
	if err := fs.Parse(args); err != nil {
		return parsedFlags{}, err
	}
	p.args = fs.Args()
	return p, nil
}

// recorder notes the value a flag is given as written (a flag.Func's String is empty).
type recorder struct {
	flag.Value
	note func(string)
}

func (r recorder) Set(v string) error {
	r.note(v)
	return r.Value.Set(v)
}

func (r recorder) IsBoolFlag() bool {
	b, ok := r.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}
