package devcreds

import (
	"errors"
	"flag"
	"strings"
)

// Flags registers the devcreds command's flags on fs (deploy/docker/devcreds): --dir, and
// --host, which repeats. The command parses its arguments with them, and deploy's tests
// parse the command docker compose gives it.
func Flags(fs *flag.FlagSet) (dir *string, hosts *[]string) {
	dir = fs.String("dir", "", "directory to keep the credentials in (required)")
	var list hostList
	fs.Var(&list, "host", "a name or address the serving certificate must cover besides "+strings.Join(DefaultHosts, ", ")+" (repeatable)")
	return dir, (*[]string)(&list)
}

// hostList is a repeatable flag.
type hostList []string

func (h *hostList) String() string { return strings.Join(*h, ",") }

func (h *hostList) Set(v string) error {
	if v == "" {
		return errors.New("empty host")
	}
	*h = append(*h, v)
	return nil
}
