package k8s

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"text/template"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flytekube/backend/executor/pluginmachinery/core"
	"github.com/flytekube/backend/executor/pluginmachinery/k8s/podtemplate"
)

// section is the key of Config in the executor's configuration file, named in the
// errors of decoding it.
const section = "k8s"

// Config holds the cluster's defaults for the objects the Kubernetes plugins (container,
// k8s-job) create, and how the manager treats them. It is the executor's configuration
// section k8s as is: the json tags are its YAML keys, and the executor's configuration
// (package executor/config) holds the defaults, in Default, and validates it.
type Config struct {
	// DefaultCPURequest and DefaultMemoryRequest fill containers that request nothing.
	// Default 100m and 128Mi.
	DefaultCPURequest    resource.Quantity `json:"defaultCpuRequest"`
	DefaultMemoryRequest resource.Quantity `json:"defaultMemoryRequest"`
	// DefaultLabels and DefaultAnnotations go on every object (the executor's own labels
	// win over them). None by default.
	DefaultLabels      map[string]string `json:"defaultLabels,omitempty"`
	DefaultAnnotations map[string]string `json:"defaultAnnotations,omitempty"`
	// InterruptibleTolerations and InterruptibleNodeSelector place the pods of actions
	// with spec.interruptible on preemptible nodes. None by default.
	InterruptibleTolerations  []corev1.Toleration `json:"interruptibleTolerations,omitempty"`
	InterruptibleNodeSelector map[string]string   `json:"interruptibleNodeSelector,omitempty"`
	// InterruptibleFailureThreshold moves an interruptible action to on-demand capacity
	// once preemptible capacity has failed it often enough: a positive N runs its
	// attempts interruptible while it has had fewer than N system failures (preemptions,
	// evictions and node shutdowns are system failures); a negative -N, while it has had
	// fewer than maxSystemFailures less N, so that the last attempts of the system budget
	// do not meet the same fate. The reconciler applies it, not the plugins. Default 0:
	// interruptible always.
	InterruptibleFailureThreshold int `json:"interruptibleFailureThreshold,omitempty"`
	// InjectFinalizer puts the executor's finalizer on every object, so that it cannot
	// vanish (and take its status with it) before the executor has read its outcome.
	// Default false.
	InjectFinalizer bool `json:"injectFinalizer"`
	// DeleteOnFinalize deletes an attempt's object as soon as the attempt is over; by
	// default it stays (with its logs) until its TaskAction is deleted.
	DeleteOnFinalize bool `json:"deleteOnFinalize"`
	// ImagePullGracePeriod is how long a pod may fail to pull its image before the
	// attempt fails as a user error (an image that is not there, or that the node may
	// not pull); 0 fails it at the first failed pull. Default 3m.
	ImagePullGracePeriod metav1.Duration `json:"imagePullGracePeriod"`
	// MissingSecretGracePeriod is how long a pod may wait for a Secret or key of its
	// action's spec.secrets that does not exist (one a controller syncs may appear
	// moments later) before the attempt fails as the user error MissingSecret; 0 fails
	// it at once. Default 30s.
	MissingSecretGracePeriod metav1.Duration `json:"missingSecretGracePeriod"`
	// MountFileStorage mounts a container action's file:// input and its attempt's
	// output directory into its pod (hostPath), so that a task on a single-node cluster
	// whose executor runs on the node, as `make run`'s, reads and writes them where the
	// executor does. Never on a shared cluster: pods would write to nodes' disks. It
	// needs a file:// prefix in storage.allowedPrefixes. Default false.
	MountFileStorage bool `json:"mountFileStorage"`
	// Config says which PodTemplates shape the pods of container and k8s-job actions
	// (see package podtemplate): embedded, so that its keys (defaultPodTemplateName,
	// inlinePodTemplateLevel, inlinePodTemplateFields) are keys of this section.
	podtemplate.Config
	// DeviceFaults are the events that make a failed attempt a fault of the node's
	// devices, and so a system failure (see DeviceFaultConfig).
	DeviceFaults DeviceFaultConfig `json:"deviceFaults"`

	// DeviceFaultRules are DeviceFaults' patterns compiled (CompileDeviceFaults). They
	// are no key of the section: the executor compiles them at start.
	DeviceFaultRules []DeviceFaultRule `json:"-"`

	// LogLinks are templates of links to an attempt's logs (text/template over
	// LogLinkData), such as a cluster's log viewer. They are no key of the section: the
	// executor parses them from its configuration's logLinks.
	LogLinks []LogLinkTemplate `json:"-"`
}

// UnmarshalJSON decodes the members present in data, keeping the current value of the
// rest, and refuses unknown members. It exists so that a malformed quantity is reported
// with its YAML path, which resource.Quantity's own error does not give.
func (c *Config) UnmarshalJSON(data []byte) error {
	type plain Config // without this method, so decoding does not recurse
	var fields struct {
		*plain
		DefaultCPURequest    json.RawMessage `json:"defaultCpuRequest"`
		DefaultMemoryRequest json.RawMessage `json:"defaultMemoryRequest"`
	}
	fields.plain = (*plain)(c)
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&fields); err != nil {
		return fmt.Errorf("%s: %w", section, err)
	}
	for _, q := range []struct {
		name string
		raw  json.RawMessage
		dst  *resource.Quantity
	}{
		{"defaultCpuRequest", fields.DefaultCPURequest, &c.DefaultCPURequest},
		{"defaultMemoryRequest", fields.DefaultMemoryRequest, &c.DefaultMemoryRequest},
	} {
		if len(q.raw) == 0 || string(q.raw) == "null" {
			continue
		}
		if err := q.dst.UnmarshalJSON(q.raw); err != nil {
			return fmt.Errorf("%s.%s: %w", section, q.name, err)
		}
	}
	return nil
}

// LogLinkTemplate makes one log link.
type LogLinkTemplate struct {
	Name     string
	Template *template.Template
}

// LogLinkData is what a log link template may use.
type LogLinkData struct {
	Namespace, PodName, ContainerName string
	Project, Domain, Run, Action      string
	Attempt                           int32
}

// Links renders the templates; a template that fails is left out. (The reconciler leaves
// out any link that is not an absolute URI, whichever plugin made it.)
func (c Config) Links(data LogLinkData) []core.LogLink {
	var out []core.LogLink
	for _, t := range c.LogLinks {
		var b strings.Builder
		if err := t.Template.Execute(&b, data); err == nil {
			out = append(out, core.LogLink{Name: t.Name, URI: b.String()})
		}
	}
	return out
}
