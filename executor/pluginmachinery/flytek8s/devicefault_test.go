package flytek8s_test

import (
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/pluginmachinery/core"
	"github.com/flytekube/backend/executor/pluginmachinery/flytek8s"
	"github.com/flytekube/backend/executor/pluginmachinery/k8s"
)

func defaultRules(t *testing.T) []k8s.DeviceFaultRule {
	t.Helper()
	rules, err := k8s.CompileDeviceFaults(k8s.DeviceFaultConfig{Patterns: k8s.DefaultDeviceFaultPatterns()})
	if err != nil {
		t.Fatal(err)
	}
	return rules
}

func warning(reason, message string) corev1.Event {
	return corev1.Event{Type: corev1.EventTypeWarning, Reason: reason, Message: message, Source: corev1.EventSource{Component: "agent"}}
}

// The default patterns know NVIDIA's reports in the forms node agents write them, and
// leave out the Xids an application causes.
func TestFindDeviceFault(t *testing.T) {
	rules := defaultRules(t)
	for _, c := range []struct {
		name    string
		events  []corev1.Event
		pattern string // "" for none
		code    string
	}{
		{"kernel line", []corev1.Event{warning("NvidiaXid", "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.")}, "nvidia-xid", "79"},
		{"device plugin", []corev1.Event{warning("XidCriticalError", "XidCriticalError: Xid=48 on Device=GPU-6f3c, the device will go unhealthy.")}, "nvidia-xid", "48"},
		{"health agent", []corev1.Event{warning("GPUXidError", "[gpu-health] [critical] Xid 94 (Contained ECC error) on GPU 0 GPU-6f3c. xid=94 severity=critical")}, "nvidia-xid", "94"},
		{"nvswitch", []corev1.Event{warning("GPUSXidError", "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress non-posted PRIV error")}, "nvidia-sxid", "12028"},
		{"application xid", []corev1.Event{warning("NvidiaXid", "NVRM: Xid (PCI:0000:3b:00): 31, pid=1234, name=python, MMU Fault")}, "", ""},
		{"application then hardware in one message", []corev1.Event{warning("NvidiaXid", "Xid 13 then Xid 79")}, "nvidia-xid", "79"},
		{"normal event", []corev1.Event{{Type: corev1.EventTypeNormal, Reason: "NvidiaXid", Message: "Xid 79"}}, "", ""},
		{"word inside another", []corev1.Event{warning("BackOff", "image GPUXid79 fails")}, "", ""},
		{"no events", nil, "", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			f, ok := flytek8s.FindDeviceFault(rules, c.events)
			if ok != (c.pattern != "") || f.Pattern != c.pattern || f.Code != c.code {
				t.Fatalf("got %+v, %v; want pattern %q code %q", f, ok, c.pattern, c.code)
			}
		})
	}
}

// Configured patterns: each regular expression set must match; a bad one is refused
// with its path.
func TestDeviceFaultPatterns(t *testing.T) {
	rules, err := k8s.CompileDeviceFaults(k8s.DeviceFaultConfig{Patterns: []k8s.DeviceFaultPattern{
		{Name: "tpu", Reason: `^TPUFault$`, Source: `^tpu-monitor$`},
	}})
	if err != nil {
		t.Fatal(err)
	}
	tpu := corev1.Event{Type: corev1.EventTypeWarning, Reason: "TPUFault", Message: "chip 3 halted", Source: corev1.EventSource{Component: "tpu-monitor"}}
	if f, ok := flytek8s.FindDeviceFault(rules, []corev1.Event{tpu}); !ok || f.Pattern != "tpu" || f.Message != "chip 3 halted" {
		t.Fatalf("got %+v, %v", f, ok)
	}
	tpu.Source.Component = "someone-else"
	if f, ok := flytek8s.FindDeviceFault(rules, []corev1.Event{tpu}); ok {
		t.Fatalf("an event of another source matched: %+v", f)
	}
	for _, c := range []struct {
		p    k8s.DeviceFaultPattern
		want string
	}{
		{k8s.DeviceFaultPattern{Name: "x", Message: `Xid (`}, "k8s.deviceFaults.patterns[0].message: not a regular expression"},
		{k8s.DeviceFaultPattern{Name: "x", Reason: `(?<`}, "k8s.deviceFaults.patterns[0].reason: not a regular expression"},
		{k8s.DeviceFaultPattern{Message: "x"}, "k8s.deviceFaults.patterns[0].name: must be set"},
		{k8s.DeviceFaultPattern{Name: "x", Source: "agent"}, "needs a reason or a message"},
		{k8s.DeviceFaultPattern{Name: "x", Message: `Xid (\d+)`, IgnoreCodes: []string{"31"}}, "a group named code"},
	} {
		_, err := k8s.CompileDeviceFaults(k8s.DeviceFaultConfig{Patterns: []k8s.DeviceFaultPattern{c.p}})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: got %v; want %q", c.p, err, c.want)
		}
	}
}

// Every byte of an event is its writer's: a huge message, invalid UTF-8 and NUL bytes,
// and a flood of events are read within bounds.
func TestDeviceFaultHostileEvents(t *testing.T) {
	rules := defaultRules(t)
	huge := "NVRM: Xid (PCI:0000:3b:00): 79, \xff\xfe\x00 " + strings.Repeat("é", 1<<20)
	f, ok := flytek8s.FindDeviceFault(rules, []corev1.Event{warning(strings.Repeat("R\xff", 1000), huge)})
	if !ok {
		t.Fatal("the fault at the start of a huge message was not found")
	}
	for name, s := range map[string]string{"reason": f.Reason, "message": f.Message, "code": f.Code, "source": f.Source} {
		if !utf8.ValidString(s) || strings.ContainsRune(s, 0) || len(s) > 512 {
			t.Errorf("%s is not bounded valid text: %d bytes, valid %v", name, len(s), utf8.ValidString(s))
		}
	}
	// The fault only past the part of a message that is read: not seen.
	if f, ok := flytek8s.FindDeviceFault(rules, []corev1.Event{warning("X", strings.Repeat("a", 1<<20)+" Xid 79")}); ok {
		t.Fatalf("read past the bound of a message: %+v", f)
	}
	// The newest events are looked at; a flood of older ones is not read through.
	flood := make([]corev1.Event, 10000)
	for i := range flood {
		flood[i] = warning("Spam", fmt.Sprintf("Xid 79 %d", i))
	}
	flood = append(flood, warning("Spam", "nothing"))
	if f, ok := flytek8s.FindDeviceFault(rules, flood); !ok || f.Message != "Xid 79 9999" {
		t.Fatalf("got %+v, %v; want the newest fault", f, ok)
	}
	flood = append(flood[:1], make([]corev1.Event, 1000)...)
	for i := 1; i < len(flood); i++ {
		flood[i] = warning("Spam", "nothing")
	}
	if f, ok := flytek8s.FindDeviceFault(rules, flood); ok {
		t.Fatalf("looked past the newest events' bound: %+v", f)
	}
}

// PhaseFromEvents makes the user's failure of a failed pod the system's when a fault is
// reported; waits for a late report while a pod that requested a GPU stopped recently;
// and changes nothing else.
func TestPhaseFromEventsDeviceFaults(t *testing.T) {
	stopped := time.Date(2026, 12, 6, 1, 0, 0, 0, time.UTC)
	cfg := k8s.Config{DeviceFaults: k8s.DeviceFaultConfig{Patterns: k8s.DefaultDeviceFaultPatterns(),
		LateEventWait: metav1.Duration{Duration: 30 * time.Second}, DeviceResourcePrefixes: []string{"nvidia.com/"}}}
	cfg.DeviceFaultRules = defaultRules(t)
	pods := flytek8s.NewTaskPods(cfg, nil)
	pod := func(phase corev1.PodPhase, exit int32, gpu bool) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "a-1"}, Spec: corev1.PodSpec{NodeName: "node-1",
			Containers: []corev1.Container{{Name: flytek8s.ContainerName}}}}
		if gpu {
			p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}
		}
		p.Status.Phase = phase
		p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: flytek8s.ContainerName, State: corev1.ContainerState{
			Terminated: &corev1.ContainerStateTerminated{ExitCode: exit, Reason: "Error", FinishedAt: metav1.NewTime(stopped)}}}}
		return p
	}
	xid := []corev1.Event{warning("NvidiaXid", "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.")}
	for _, c := range []struct {
		name   string
		pod    *corev1.Pod
		info   core.PhaseInfo
		events []corev1.Event
		after  time.Duration
		want   core.Phase
		kind   core.ErrorKind
		code   string
		reason string
	}{
		{"fault", pod(corev1.PodFailed, 1, false), flytek8s.FailureOf(pod(corev1.PodFailed, 1, false)), xid, time.Second,
			core.PhaseRetryableFailure, core.ErrorKindSystem, flytek8s.CodeDeviceFault, flytek8s.CodeDeviceFault},
		{"no fault", pod(corev1.PodFailed, 1, false), flytek8s.FailureOf(pod(corev1.PodFailed, 1, false)), nil, time.Second,
			core.PhaseRetryableFailure, core.ErrorKindUser, "ExitCode1", "ExitCode1"},
		{"gpu pod, no fault yet", pod(corev1.PodFailed, 1, true), flytek8s.FailureOf(pod(corev1.PodFailed, 1, true)), nil, time.Second,
			core.PhaseRunning, core.ErrorKindUser, "", flytek8s.ReasonWaitingForDeviceFaults},
		{"gpu pod, no fault after the wait", pod(corev1.PodFailed, 1, true), flytek8s.FailureOf(pod(corev1.PodFailed, 1, true)), nil, time.Minute,
			core.PhaseRetryableFailure, core.ErrorKindUser, "ExitCode1", "ExitCode1"},
		{"gpu pod, fault late", pod(corev1.PodFailed, 1, true), flytek8s.FailureOf(pod(corev1.PodFailed, 1, true)), xid, 20 * time.Second,
			core.PhaseRetryableFailure, core.ErrorKindSystem, flytek8s.CodeDeviceFault, flytek8s.CodeDeviceFault},
		{"succeeded", pod(corev1.PodSucceeded, 0, true), core.PhaseInfoSuccess(""), xid, time.Second,
			core.PhaseSuccess, core.ErrorKindUser, "", ""},
		{"already the system's", pod(corev1.PodFailed, 137, false), core.PhaseInfoSystemFailure("Evicted", "evicted"), xid, time.Second,
			core.PhaseRetryableFailure, core.ErrorKindSystem, "Evicted", "Evicted"},
	} {
		t.Run(c.name, func(t *testing.T) {
			tCtx := core.NewTaskExecutionContext(core.ExecutionContextOptions{Action: &flytev1.TaskAction{}, Attempt: 1,
				Clock: func() time.Time { return stopped.Add(c.after) }})
			reads := 0
			got, err := pods.PhaseFromEvents(t.Context(), tCtx, c.pod, c.info, func() ([]corev1.Event, error) { reads++; return c.events, nil })
			if err != nil {
				t.Fatal(err)
			}
			if got.Phase != c.want || got.Reason != c.reason || (got.Err == nil) != (c.code == "") ||
				got.Err != nil && (got.Err.Kind != c.kind || got.Err.Code != c.code) {
				t.Fatalf("got %+v (error %+v); want %s %v %s %q", got, got.Err, c.want, c.kind, c.code, c.reason)
			}
			if c.want == core.PhaseSuccess && reads != 0 {
				t.Fatalf("the events of a pod that succeeded were read %d times", reads)
			}
			if c.reason == flytek8s.ReasonWaitingForDeviceFaults && got.RequeueAfter != 29*time.Second {
				t.Fatalf("waits %s; want the 29s left", got.RequeueAfter)
			}
			if c.code == flytek8s.CodeDeviceFault && (!strings.Contains(got.Err.Message, "Xid (PCI:0000:3b:00): 79") ||
				!strings.Contains(got.Err.Message, "ExitCode1") || !strings.Contains(got.Err.Message, "node node-1")) {
				t.Fatalf("the failure says %q", got.Err.Message)
			}
		})
	}
}
