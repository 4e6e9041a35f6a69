package job

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/pluginmachinery/core"
	"github.com/flytekube/backend/executor/pluginmachinery/flytek8s"
)

// TestMissingSecret: a Job's pods fail the attempt when one of them cannot start for a
// Secret that does not exist, and the events of at most maxEventReads pods that may
// still be mounting are read per pass.
func TestMissingSecret(t *testing.T) {
	secrets := []flytev1.TaskSecret{{Name: "db", Key: "password", Env: "DB_PASSWORD"}, {Name: "tls", MountPath: "/etc/tls"}}
	// A pod on its node whose task container waits for reason; the kubelet has mounted its
	// volumes (and made its sandbox) unless it waits for ContainerCreating.
	waiting := func(name, reason, message string) corev1.Pod {
		pod := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PodSpec{NodeName: "node-1"},
			Status: corev1.PodStatus{Phase: corev1.PodPending, ContainerStatuses: []corev1.ContainerStatus{{Name: flytek8s.ContainerName,
				State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: message}}}}}}
		if reason != "ContainerCreating" {
			pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReadyToStartContainers, Status: corev1.ConditionTrue}}
		}
		return pod
	}
	mounting := func(name string) corev1.Pod { return waiting(name, "ContainerCreating", "") }
	started := waiting("started", "ImagePullBackOff", "")
	unscheduled := mounting("unscheduled")
	unscheduled.Spec.NodeName = ""
	failedMount := func(message string) []corev1.Event {
		return []corev1.Event{{Reason: "FailedMount", Message: message}}
	}
	notFound := failedMount(`MountVolume.SetUp failed for volume "flyte-secret-1" : secret "tls" not found`)
	tests := []struct {
		name      string
		pods      []corev1.Pod
		events    map[string][]corev1.Event // by pod; a pod missing here has a read error
		wantReads int
		want      string // in the failure's message; "" for none
	}{
		{name: "no pods"},
		{name: "a variable's key does not exist",
			pods: []corev1.Pod{waiting("a", "CreateContainerConfigError", "couldn't find key password in Secret ns/db")},
			want: `container task cannot start: Secret "db" key "password" does not exist (spec.secrets[0], env DB_PASSWORD)`},
		{name: "another configuration error", pods: []corev1.Pod{waiting("a", "CreateContainerConfigError", `configmap "x" not found`)}},
		{name: "a volume's Secret does not exist, on the second pod", pods: []corev1.Pod{mounting("a"), mounting("b")},
			events: map[string][]corev1.Event{"a": nil, "b": notFound}, wantReads: 2,
			want: `pod b cannot start: Secret "tls" does not exist (spec.secrets[1], mountPath /etc/tls)`},
		{name: "another mount failure", pods: []corev1.Pod{mounting("a")},
			events: map[string][]corev1.Event{"a": failedMount(`MountVolume.SetUp failed for volume "kube-api-access" : timed out`)}, wantReads: 1},
		{name: "events cannot be read", pods: []corev1.Pod{mounting("a")}, wantReads: 1},
		{name: "pods that cannot be mounting are not read", pods: []corev1.Pod{started, unscheduled},
			events: map[string][]corev1.Event{"started": notFound, "unscheduled": notFound}},
		{name: "a few pods' events at most", pods: []corev1.Pod{mounting("a"), mounting("b"), mounting("c"), mounting("d")},
			events: map[string][]corev1.Event{"a": nil, "b": nil, "c": nil, "d": notFound}, wantReads: maxEventReads},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reads := 0
			info, failed := missingSecret(tt.pods, secrets, func(pod *corev1.Pod) ([]corev1.Event, error) {
				reads++
				events, ok := tt.events[pod.Name]
				if !ok {
					return nil, errors.New("the API server is away")
				}
				return events, nil
			})
			if reads != tt.wantReads {
				t.Fatalf("read the events of %d pods; want %d", reads, tt.wantReads)
			}
			if failed != (tt.want != "") {
				t.Fatalf("failed %v (%+v); want a failure saying %q", failed, info, tt.want)
			}
			if !failed {
				return
			}
			if info.Phase != core.PhasePermanentFailure || info.Err == nil || info.Err.Code != flytek8s.CodeMissingSecret ||
				info.Err.Kind != core.ErrorKindUser || !strings.Contains(info.Err.Message, tt.want) {
				t.Fatalf("got %s %s; want the user's %s saying %q", info.Phase, fmt.Sprint(info.Err), flytek8s.CodeMissingSecret, tt.want)
			}
		})
	}
}
