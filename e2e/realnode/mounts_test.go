package realnode_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/config"
)

// TestAPodCannotRedirectAnotherPodsMount: with k8s.mountFileStorage, an action may set its
// runOutputBase and inputUri inside another action's output directory (same project).
// That other action's pod, running, waits until the executor has made and checked the
// victim's paths, then swaps a directory on each for a symbolic link to a host directory
// outside the data store, before the kubelet mounts them: a mount follows links. The
// victim must get its own input and an output directory of its own, and nothing of the
// host directory, nor write into it.
func TestAPodCannotRedirectAnotherPodsMount(t *testing.T) {
	ns := node.Namespace(t)
	data, host := t.TempDir(), t.TempDir()
	const secret = "HOST-SECRET"
	for name, content := range map[string]string{"inputs.json": secret, "victim/1/secret": secret} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(host, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(host, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	runExecutor(t, ns, func(c *config.Config) {
		c.Storage.AllowedPrefixes, c.K8s.MountFileStorage = []string{"file://" + data}, true
	})
	attackerOut := filepath.Join(data, "runs", "attacker", "1")
	// The victim's input, as an earlier output in the attacker's output directory.
	if err := os.MkdirAll(filepath.Join(attackerOut, "in"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(attackerOut, "in", "inputs.json"), []byte("victim-input"), 0o644); err != nil {
		t.Fatal(err)
	}

	// The attacker swaps "in" and "nest" once the victim's output directory exists (the
	// executor makes and checks it last), and gives up after 40 s.
	attacker := containerAction(ns, "attacker", 0, `out=${FLYTE_OUTPUT_PREFIX#file://}; i=0; `+
		`until [ -d $out/nest/victim/1 ] || [ $i -ge 2000 ]; do sleep 0.02; i=$((i+1)); done; `+
		`[ -d $out/nest/victim/1 ] || { echo "never saw the victim's directory"; exit 0; }; sleep 0.05; `+
		`mv $out/in $out/in.orig && ln -s `+host+` $out/in; mv $out/nest $out/nest.orig && ln -s `+host+` $out/nest; `+
		`echo swapped; ls -l $out`)
	attacker.Spec.RunOutputBase = "file://" + filepath.Join(data, "runs")
	create(t, attacker)
	waitPhase(t, attacker, flytev1.PhaseRunning)

	victim := containerAction(ns, "victim", 0, `echo "input: $(cat ${FLYTE_INPUT_URI#file://})"; out=${FLYTE_OUTPUT_PREFIX#file://}; `+
		`echo "found: $(cat $out/secret 2>/dev/null)"; echo probe > $out/probe; sleep 1`)
	victim.Spec.InputURI = "file://" + filepath.Join(attackerOut, "in", "inputs.json")
	victim.Spec.RunOutputBase = "file://" + filepath.Join(attackerOut, "nest")
	create(t, victim)
	got := waitFinished(t, victim)

	var pod corev1.Pod
	logs := ""
	if err := node.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "victim-1"}, &pod); err == nil {
		logs, _ = node.Logs(context.Background(), &pod, pod.Spec.Containers[0].Name)
	}
	if strings.Contains(logs, secret) {
		t.Errorf("the victim's pod read the host's files through the swapped links:\n%s", logs)
	}
	if _, err := os.Stat(filepath.Join(host, "victim", "1", "probe")); err == nil {
		t.Errorf("the victim's pod wrote into the host directory %s", host)
	}
	if got.Status.Phase != flytev1.PhaseSucceeded {
		t.Fatalf("the victim ended %s (%s); want Succeeded, on its own data; logs:\n%s", got.Status.Phase, history(got), logs)
	}
	if !strings.Contains(logs, "input: victim-input") {
		t.Errorf("the victim did not read its own input; logs:\n%s", logs)
	}
	if probe, err := os.ReadFile(filepath.Join(attackerOut, "nest", "victim", "1", "probe")); err != nil || strings.TrimSpace(string(probe)) != "probe" {
		t.Errorf("the victim's output %q (%v); want its probe at its output URI", probe, err)
	}
}
