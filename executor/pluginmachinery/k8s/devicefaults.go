package k8s

import (
	"fmt"
	"regexp"
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// DeviceFaultConfig says which Kubernetes events on a failed attempt's pod report a fault
// of the node's devices (a GPU's Xid, an NVSwitch's SXid), which makes the failure the
// platform's: it is retried on the system budget, not the user's.
type DeviceFaultConfig struct {
	// Patterns are the events that report a fault; a Warning event about the pod that
	// one of them matches is one. None turns the classification off.
	Patterns []DeviceFaultPattern `json:"patterns"`
	// LateEventWait is how long after its task container stopped a failed attempt of a
	// pod that requests a device (DeviceResourcePrefixes) waits for a fault report before
	// its failure is charged to the user: the node's agent reads the kernel's log, and
	// may record the fault moments after the container died of it. 0 does not wait.
	LateEventWait metav1.Duration `json:"lateEventWait"`
	// DeviceResourcePrefixes are the prefixes of the extended resources ("nvidia.com/")
	// whose pods wait LateEventWait.
	DeviceResourcePrefixes []string `json:"deviceResourcePrefixes,omitempty"`
}

// DeviceFaultPattern is one kind of event that reports a device fault: each regular
// expression (RE2) set must match, Reason the event's reason, Message its message, Source
// the component that reported it. A Message with a group named code ("(?P<code>\d+)")
// names the fault's code, and IgnoreCodes lists codes that are not the node's fault (an
// Xid an application causes).
type DeviceFaultPattern struct {
	// Name names the pattern in the failure's message, such as "nvidia-xid".
	Name        string   `json:"name"`
	Reason      string   `json:"reason,omitempty"`
	Message     string   `json:"message,omitempty"`
	Source      string   `json:"source,omitempty"`
	IgnoreCodes []string `json:"ignoreCodes,omitempty"`
}

// XidApplicationCodes are the Xids NVIDIA attributes to the application rather than the
// GPU (13 graphics engine exception, 31 memory page fault, 43 stopped processing, 45
// preemptive cleanup, 68 video processor exception, 109 context switch timeout), as the
// NVIDIA device plugin skips them when it marks a GPU unhealthy.
var XidApplicationCodes = []string{"13", "31", "43", "45", "68", "109"}

// DefaultDeviceFaultPatterns match NVIDIA's Xid and SXid reports in the forms node agents
// write them in an event's message: the driver's kernel line ("NVRM: Xid (PCI:0000:3b:00):
// 79, pid=…", "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Non-fatal, …"), the
// device plugin's ("Xid=79 on Device=GPU-…") and a health agent's sentence ("Xid 79 (GPU
// has fallen off the bus) on GPU 0 …", reasons GPUXidError and GPUSXidError).
func DefaultDeviceFaultPatterns() []DeviceFaultPattern {
	return []DeviceFaultPattern{
		{Name: "nvidia-xid", Message: `\bXid(?: \(PCI:[^)]*\):|=| ) ?(?P<code>\d+)\b`, IgnoreCodes: slices.Clone(XidApplicationCodes)},
		{Name: "nvidia-sxid", Message: `\bSXid(?: \(PCI:[^)]*\):|=| ) ?(?P<code>\d+)\b`},
	}
}

// DeviceFaultRule is a compiled DeviceFaultPattern.
type DeviceFaultRule struct {
	Name                    string
	Reason, Message, Source *regexp.Regexp
	IgnoreCodes             []string
}

// CompileDeviceFaults compiles the patterns, naming the first bad one by its YAML path.
func CompileDeviceFaults(c DeviceFaultConfig) ([]DeviceFaultRule, error) {
	var out []DeviceFaultRule
	for i, p := range c.Patterns {
		path := fmt.Sprintf("%s.deviceFaults.patterns[%d]", section, i)
		if p.Name == "" {
			return nil, fmt.Errorf("%s.name: must be set", path)
		}
		if p.Reason == "" && p.Message == "" {
			return nil, fmt.Errorf("%s: needs a reason or a message: a pattern of the source alone would take any event for a fault", path)
		}
		r := DeviceFaultRule{Name: p.Name, IgnoreCodes: p.IgnoreCodes}
		for _, f := range []struct {
			key, expr string
			dst       **regexp.Regexp
		}{{"reason", p.Reason, &r.Reason}, {"message", p.Message, &r.Message}, {"source", p.Source, &r.Source}} {
			if f.expr == "" {
				continue
			}
			re, err := regexp.Compile(f.expr)
			if err != nil {
				return nil, fmt.Errorf("%s.%s: not a regular expression (RE2): %w", path, f.key, err)
			}
			*f.dst = re
		}
		if len(p.IgnoreCodes) > 0 && (r.Message == nil || r.Message.SubexpIndex("code") < 0) {
			return nil, fmt.Errorf("%s.ignoreCodes: the message needs a group named code, (?P<code>…), to compare them with", path)
		}
		out = append(out, r)
	}
	return out, nil
}
