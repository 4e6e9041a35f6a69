package v1_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/kubectl/pkg/cmd/get"
	cmdutil "k8s.io/kubectl/pkg/cmd/util"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
)

// kubectlGet runs `kubectl get` in-process (kubectl's own command, against the
// envtest API server) and returns what it printed.
func kubectlGet(t *testing.T, args ...string) string {
	t.Helper()
	kubeconfig, err := env.Kubeconfig()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, kubeconfig, 0o600); err != nil {
		t.Fatal(err)
	}
	flags := genericclioptions.NewConfigFlags(false)
	var out, errOut bytes.Buffer
	cmd := get.NewCmdGet("kubectl", cmdutil.NewFactory(flags), genericiooptions.IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &errOut})
	flags.AddFlags(cmd.PersistentFlags()) // --kubeconfig, -n, as kubectl's root command has them
	cmd.SetArgs(append(args, "--kubeconfig", path))
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	// kubectl reports a failed request through its fatal-error handler, which exits.
	cmdutil.BehaviorOnFatal(func(msg string, _ int) { t.Fatalf("kubectl get %v: %s", args, msg) })
	defer cmdutil.DefaultBehaviorOnFatal()
	if err := cmd.Execute(); err != nil {
		t.Fatalf("kubectl get %v: %v\n%s", args, err, errOut.String())
	}
	return out.String()
}

// TestFieldSelectors: people find actions by phase, project and run with
// `kubectl get taskactions --field-selector ...`, as docs/executor.md shows.
func TestFieldSelectors(t *testing.T) {
	ns := env.Namespace(t)
	for _, a := range []struct {
		name, project, run string
		phase              flytev1.Phase
	}{
		{"failed-one", "alpha", "r1", flytev1.PhaseFailed},
		{"done-one", "alpha", "r2", flytev1.PhaseSucceeded},
		{"done-two", "beta", "r1", flytev1.PhaseSucceeded},
	} {
		ta := sample(t, ns)
		ta.Name, ta.Spec.Project, ta.Spec.RunName, ta.Spec.ActionName = a.name, a.project, a.run, a.name
		if err := env.Client.Create(ctx(t), ta); err != nil {
			t.Fatal(err)
		}
		micro := metav1.NewMicroTime(metav1.Now().Time)
		ta.Status = flytev1.TaskActionStatus{Phase: a.phase, Attempts: 1,
			PhaseHistory: []flytev1.PhaseTransition{{Phase: a.phase, Attempt: 1, OccurredAt: micro}}}
		if err := env.Client.Status().Update(ctx(t), ta); err != nil {
			t.Fatalf("status of %s: %v", a.name, err)
		}
	}
	for _, tt := range []struct{ selector, want string }{
		{"status.phase=Failed", "failed-one"},
		{"status.phase=Succeeded", "done-one done-two"},
		{"spec.project=beta", "done-two"},
		{"spec.runName=r1", "done-two failed-one"},
		{"spec.project=alpha,status.phase=Succeeded", "done-one"},
	} {
		t.Run(tt.selector, func(t *testing.T) {
			out := kubectlGet(t, "taskactions", "-n", ns, "--field-selector", tt.selector, "-o", "custom-columns=NAME:.metadata.name", "--no-headers")
			if got := strings.Join(strings.Fields(out), " "); got != tt.want {
				t.Fatalf("got %q; want %q", got, tt.want)
			}
		})
	}
}
