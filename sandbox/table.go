package sandbox

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/internal/textbound"
)

// progress shows the examples as they run: on a terminal a table redrawn in place, and
// elsewhere (a log, a CI job) one line per change.
type progress struct {
	w        io.Writer
	terminal bool
	drawn    int               // lines of the last table drawn
	last     map[string]string // the last line printed per example, off a terminal
}

func newProgress(w io.Writer, terminal bool) *progress {
	return &progress{w: w, terminal: terminal, last: map[string]string{}}
}

func (p *progress) show(examples []*example, now time.Time) {
	if !p.terminal {
		for _, e := range examples {
			line := e.action.Name + ": " + strings.Join(row(e, now)[2:6], " ")
			if p.last[e.action.Name] != line {
				p.last[e.action.Name] = line
				fmt.Fprintln(p.w, line)
			}
		}
		return
	}
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tTASK TYPE\tPHASE\tATTEMPTS\tCACHE\tREASON\tAGE\tAS EXPECTED")
	for _, e := range examples {
		fmt.Fprintln(tw, strings.Join(row(e, now), "\t"))
	}
	_ = tw.Flush()
	if p.drawn > 0 {
		fmt.Fprintf(p.w, "\033[%dA\033[J", p.drawn) // back to the table's first line, and clear below
	}
	fmt.Fprint(p.w, b.String())
	p.drawn = strings.Count(b.String(), "\n")
}

func row(e *example, now time.Time) []string {
	ta := e.action
	done, problem := e.verdict()
	mark := "…"
	switch {
	case problem != "":
		mark = "no: " + problem
	case done:
		mark = "yes"
	}
	if !e.applied {
		return []string{ta.Name, ta.Spec.TaskType, "-", "-", "-", "after " + ta.Annotations[annotationAfter], "-", mark}
	}
	if e.rejected != nil {
		return []string{ta.Name, ta.Spec.TaskType, "Rejected", "-", "-", refusal(e.rejected), "-", mark}
	}
	st := ta.Status
	reason := ""
	for _, c := range st.Conditions {
		if c.Type == flytev1.ConditionProgressing || (st.Phase.IsTerminal() && c.Status == "True") {
			reason = c.Reason
		}
	}
	if st.Phase.IsTerminal() && st.Error != nil && st.Error.Code != reason {
		reason += " (" + st.Error.Code + ")" // what failed, as well as how it ended
	}
	age := "-"
	if !ta.CreationTimestamp.IsZero() {
		age = now.Sub(ta.CreationTimestamp.Time).Round(time.Second).String()
	}
	return []string{ta.Name, ta.Spec.TaskType, cmp.Or(string(st.Phase), "Pending"), fmt.Sprint(st.Attempts), cmp.Or(string(st.CacheStatus), "-"), cmp.Or(reason, "-"), age, mark}
}

// refusal names the fields the API server refused, or gives its message.
func refusal(err error) string {
	var status apierrors.APIStatus
	if errors.As(err, &status) && status.Status().Details != nil && len(status.Status().Details.Causes) > 0 {
		var fields []string
		for _, c := range status.Status().Details.Causes {
			if !slices.Contains(fields, c.Field) {
				fields = append(fields, c.Field)
			}
		}
		return "invalid " + strings.Join(fields, ", ")
	}
	return firstLine(err.Error(), 60)
}

func firstLine(s string, n int) string {
	s, _, _ = strings.Cut(s, "\n")
	return textbound.Cut(s, n)
}
