package k8s

import (
	"encoding/json"
	"maps"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flytekube/backend/executor/pluginmachinery/core"
)

func TestOverHardLimit(t *testing.T) {
	tests := []struct {
		msg, want string
	}{
		{`pods "r1-a0-1" is forbidden: exceeded quota: compute, requested: limits.cpu=2,requests.cpu=2, used: requests.cpu=0, limited: requests.cpu=1`, "requests.cpu"},
		{`pods "r1-a0-1" is forbidden: exceeded quota: compute, requested: requests.cpu=500m, used: requests.cpu=800m, limited: requests.cpu=1`, ""},
		{`pods "r1-a0-1" is forbidden: exceeded quota: pods, requested: pods=1, used: pods=1, limited: pods=1`, ""},
		{`pods "x" is forbidden: exceeded quota: mem, requested: requests.memory=4Gi, used: requests.memory=0, limited: requests.memory=2Gi`, "requests.memory"},
		{`forbidden: something else entirely`, ""},
	}
	for _, tt := range tests {
		if got := overHardLimit(tt.msg); got != tt.want {
			t.Errorf("overHardLimit(%q) = %q; want %q", tt.msg, got, tt.want)
		}
	}
}

// The scheduler's events carry micro-second EventTime and the kubelet's whole-second
// LastTimestamp, so a later event of the same second can look older than one reported.
func TestClusterEventsReportsEachEventOnce(t *testing.T) {
	base := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	scheduled := corev1.Event{ObjectMeta: metav1.ObjectMeta{UID: "e1"}, Reason: "Scheduled", Count: 1,
		EventTime: metav1.NewMicroTime(base.Add(500 * time.Millisecond))}
	started := corev1.Event{ObjectMeta: metav1.ObjectMeta{UID: "e2"}, Reason: "Started", Count: 1,
		LastTimestamp: metav1.NewTime(base)}
	backoff := corev1.Event{ObjectMeta: metav1.ObjectMeta{UID: "e3"}, Reason: "BackOff", Count: 1,
		LastTimestamp: metav1.NewTime(base.Add(2 * time.Second))}
	backoffAgain := backoff
	backoffAgain.Count = 2
	backoffAgain.LastTimestamp = metav1.NewTime(base.Add(2 * time.Second))

	lists := func(events ...corev1.Event) func() ([]corev1.Event, error) {
		return func() ([]corev1.Event, error) { return events, nil }
	}
	reasons := func(events []core.ClusterEvent) []string {
		var out []string
		for _, e := range events {
			out = append(out, e.Reason)
		}
		return out
	}
	var mark eventMark
	steps := []struct {
		list []corev1.Event
		want []string
	}{
		{[]corev1.Event{scheduled}, []string{"Scheduled"}},
		{[]corev1.Event{scheduled, started}, []string{"Started"}},
		{[]corev1.Event{scheduled, started}, nil},
		{[]corev1.Event{scheduled, started, backoff}, []string{"BackOff"}},
		{[]corev1.Event{scheduled, started, backoffAgain}, []string{"BackOff"}},
		{[]corev1.Event{scheduled, started, backoffAgain}, nil},
	}
	for i, s := range steps {
		var got []core.ClusterEvent
		got, mark = clusterEvents(lists(s.list...), mark)
		if !slices.Equal(reasons(got), s.want) {
			t.Errorf("step %d: reported %v; want %v", i, reasons(got), s.want)
		}
	}
	if _, err := json.Marshal(mark); err != nil {
		t.Fatal(err)
	}
}

// A cluster event names the component that reported it: a core/v1 event's source, or,
// for one written through events.k8s.io (whose source is empty), its reporting controller.
func TestClusterEventsNameTheirSource(t *testing.T) {
	at := metav1.NewTime(time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC))
	events := []corev1.Event{
		{ObjectMeta: metav1.ObjectMeta{UID: "e1"}, Reason: "Started", LastTimestamp: at, Source: corev1.EventSource{Component: "kubelet", Host: "node-1"}},
		{ObjectMeta: metav1.ObjectMeta{UID: "e2"}, Reason: "Scheduled", LastTimestamp: at, ReportingController: "default-scheduler"},
		{ObjectMeta: metav1.ObjectMeta{UID: "e3"}, Reason: "SuccessfulCreate", LastTimestamp: at,
			Source: corev1.EventSource{Component: "job-controller"}, ReportingController: "batch.kubernetes.io/job-controller"},
		{ObjectMeta: metav1.ObjectMeta{UID: "e4"}, Reason: "Anonymous", LastTimestamp: at},
	}
	got, _ := clusterEvents(func() ([]corev1.Event, error) { return events, nil }, eventMark{})
	sources := map[string]string{}
	for _, e := range got {
		sources[e.Reason] = e.Source
	}
	want := map[string]string{"Started": "kubelet", "Scheduled": "default-scheduler", "SuccessfulCreate": "job-controller", "Anonymous": ""}
	if !maps.Equal(sources, want) {
		t.Fatalf("sources %v; want %v", sources, want)
	}
}
