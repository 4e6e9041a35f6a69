package config_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flytekube/backend/executor/config"
	"github.com/flytekube/backend/executor/pluginmachinery/k8s"
	"github.com/flytekube/backend/executor/pluginmachinery/k8s/podtemplate"
	"github.com/flytekube/backend/test/repo"
)

func writeFile(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func duration(d time.Duration) metav1.Duration { return metav1.Duration{Duration: d} }

func TestDefaultIsValid(t *testing.T) {
	if err := config.Default().Validate(); err != nil {
		t.Fatalf("Default().Validate() = %v", err)
	}
	got, err := config.Load("")
	if err != nil {
		t.Fatalf(`Load("") error = %v`, err)
	}
	if !reflect.DeepEqual(got, config.Default()) {
		t.Errorf(`Load("") = %+v, want Default() = %+v`, got, config.Default())
	}
}

func TestLoadFullFileOverridesEveryField(t *testing.T) {
	dir := t.TempDir()
	tokenFile, caFile := filepath.Join(dir, "token"), filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(tokenFile, []byte("t0k3n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(caFile, []byte(testCA(t)), 0o600); err != nil {
		t.Fatal(err)
	}
	content := `
serviceTokenFile: ` + tokenFile + `
serviceCAFile: ` + caFile + `
storage:
  allowedPrefixes: ["s3://flyte-data/{project}/{domain}/", "file:///srv/flyte"]
  maxDocumentBytes: 4Mi
  maxCopyBytes: 2Gi
  callTimeout: 45s
  copyTimeout: 10m
  maxOutputEntries: 20000
  maxOutputDepth: 16
tenancy:
  projectLabel: example.com/project
  domainLabel: example.com/domain
  namespaceTemplate: "{project}-{domain}"
metricsBindAddress: ":9090"
metricsSecure: false
metricsCertPath: /certs/metrics
metricsCertName: metrics.crt
metricsCertKey: metrics.key
healthProbeBindAddress: ":9091"
leaderElect: true
leaderElectionID: executor.example.com
leaderElectionNamespace: flyte-system
namespaces: [team-a, team-b]
executorNamespace: flyte
enableHTTP2: true
eventsServiceURL: https://events.example.com
cacheServiceURL: ""
cluster: prod-eu-1
cacheSharing: cluster
defaultServiceAccount: flyte-tasks
maxSystemFailures: 5
maxConcurrentReconciles: 48
queueWeights: {team-a: 3}
retryBackoff:
  base: 500ms
  cap: 2m
gc:
  interval: 10m
  maxTTL: 24h
  maxFinished: 20000
  maxFinishedPerNamespace: 4000
  deletesPerSecond: 50.5
eventsBacklog:
  maxUndeliveredFinished: 250
eventsDelivery:
  maxRefusals: 12
defaultForTaskTypes:
  python-task: container
  sql: sqlite
logLinks:
  - name: Kubernetes
    uriTemplate: "https://logs.example.com/{{.Namespace}}/{{.PodName}}"
k8s:
  defaultCpuRequest: 250m
  defaultMemoryRequest: 256Mi
  defaultLabels: {team: ml}
  defaultAnnotations: {example.com/owner: platform}
  interruptibleTolerations:
    - {key: spot, operator: Exists, effect: NoSchedule}
  interruptibleNodeSelector: {node.example.com/spot: "true"}
  interruptibleFailureThreshold: -2
  injectFinalizer: true
  deleteOnFinalize: true
  imagePullGracePeriod: 45s
  missingSecretGracePeriod: 5s
  mountFileStorage: true
  defaultPodTemplateName: gpu-default
  inlinePodTemplateLevel: privileged
  inlinePodTemplateFields: [containers, volumes, tolerations]
  deviceFaults:
    patterns:
      - {name: tpu, reason: ^TPUFault$, message: 'chip (?P<code>\d+)', source: ^tpu-monitor$, ignoreCodes: ["0"]}
    lateEventWait: 1m
    deviceResourcePrefixes: [google.com/]
`
	want := config.Config{
		MetricsBindAddress:      ":9090",
		MetricsSecure:           false,
		MetricsCertPath:         "/certs/metrics",
		MetricsCertName:         "metrics.crt",
		MetricsCertKey:          "metrics.key",
		HealthProbeBindAddress:  ":9091",
		LeaderElect:             true,
		LeaderElectionID:        "executor.example.com",
		LeaderElectionNamespace: "flyte-system",
		Namespaces:              []string{"team-a", "team-b"},
		ExecutorNamespace:       "flyte",
		EnableHTTP2:             true,
		EventsServiceURL:        "https://events.example.com",
		CacheServiceURL:         "",
		ServiceTokenFile:        tokenFile,
		ServiceCAFile:           caFile,
		Storage: config.StorageConfig{AllowedPrefixes: []string{"s3://flyte-data/{project}/{domain}/", "file:///srv/flyte"},
			MaxDocumentBytes: resource.MustParse("4Mi"), MaxCopyBytes: resource.MustParse("2Gi"),
			CallTimeout: duration(45 * time.Second), CopyTimeout: duration(10 * time.Minute),
			MaxOutputEntries: 20000, MaxOutputDepth: 16},
		Tenancy:                 config.TenancyConfig{ProjectLabel: "example.com/project", DomainLabel: "example.com/domain", NamespaceTemplate: "{project}-{domain}"},
		Cluster:                 "prod-eu-1",
		CacheSharing:            "cluster",
		DefaultServiceAccount:   "flyte-tasks",
		MaxSystemFailures:       5,
		MaxConcurrentReconciles: 48,
		QueueWeights:            map[string]int{"team-a": 3},
		RetryBackoff:            config.RetryBackoff{Base: duration(500 * time.Millisecond), Cap: duration(2 * time.Minute)},
		GC: config.GCConfig{Interval: duration(10 * time.Minute), MaxTTL: duration(24 * time.Hour),
			MaxFinished: 20000, MaxFinishedPerNamespace: 4000, DeletesPerSecond: 50.5},
		EventsBacklog:       config.EventsBacklogConfig{MaxUndeliveredFinished: 250},
		EventsDelivery:      config.EventsDeliveryConfig{MaxRefusals: 12},
		DefaultForTaskTypes: map[string]string{"python-task": "container", "sql": "sqlite"},
		LogLinks:            []config.LogLink{{Name: "Kubernetes", URITemplate: "https://logs.example.com/{{.Namespace}}/{{.PodName}}"}},
		K8s: k8s.Config{
			DefaultCPURequest: resource.MustParse("250m"), DefaultMemoryRequest: resource.MustParse("256Mi"),
			DefaultLabels: map[string]string{"team": "ml"}, DefaultAnnotations: map[string]string{"example.com/owner": "platform"},
			InterruptibleTolerations:  []corev1.Toleration{{Key: "spot", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
			InterruptibleNodeSelector: map[string]string{"node.example.com/spot": "true"},
			InjectFinalizer:           true, DeleteOnFinalize: true, ImagePullGracePeriod: duration(45 * time.Second), MissingSecretGracePeriod: duration(5 * time.Second), MountFileStorage: true,
			Config: podtemplate.Config{DefaultPodTemplateName: "gpu-default", InlinePodTemplateLevel: "privileged",
				InlinePodTemplateFields: []string{"containers", "volumes", "tolerations"}},
			InterruptibleFailureThreshold: -2,
			DeviceFaults: k8s.DeviceFaultConfig{
				Patterns:      []k8s.DeviceFaultPattern{{Name: "tpu", Reason: "^TPUFault$", Message: `chip (?P<code>\d+)`, Source: "^tpu-monitor$", IgnoreCodes: []string{"0"}}},
				LateEventWait: duration(time.Minute), DeviceResourcePrefixes: []string{"google.com/"}},
		},
	}

	// Guard the test itself: a field added to Config but not to this file would otherwise
	// go untested without anyone noticing.
	assertDiffersEverywhere(t, reflect.ValueOf(want), reflect.ValueOf(config.Default()), "Config")

	got, err := config.Load(writeFile(t, content))
	if err != nil {
		t.Fatalf("Load() error = %v", err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Load() =\n%+v\nwant\n%+v", got, want)
	}
}

// assertDiffersEverywhere fails for each leaf field where a equals b, descending into the
// nested config structs (but not into metav1.Duration, which is compared whole). Fields
// no key of the file sets (json "-") are left out.
func assertDiffersEverywhere(t *testing.T, a, b reflect.Value, path string) {
	t.Helper()
	if a.Kind() == reflect.Struct && a.Type() != reflect.TypeFor[metav1.Duration]() && a.Type() != reflect.TypeFor[resource.Quantity]() {
		for i := range a.NumField() {
			if a.Type().Field(i).Tag.Get("json") == "-" {
				continue
			}
			assertDiffersEverywhere(t, a.Field(i), b.Field(i), path+"."+a.Type().Field(i).Name)
		}
		return
	}
	if reflect.DeepEqual(a.Interface(), b.Interface()) {
		t.Errorf("test file does not override %s: it equals the default %v", path, b.Interface())
	}
}

func TestLoadPartialFileKeepsDefaults(t *testing.T) {
	tests := []struct {
		name    string
		content string
		modify  func(*config.Config)
	}{
		{
			name:    "empty file",
			content: "",
			modify:  func(*config.Config) {},
		},
		{
			name:    "comments only",
			content: "# nothing to change\n",
			modify:  func(*config.Config) {},
		},
		{
			name:    "one top-level field",
			content: "maxConcurrentReconciles: 2\n",
			modify:  func(c *config.Config) { c.MaxConcurrentReconciles = 2 },
		},
		{
			name:    "false overrides a true default",
			content: "metricsSecure: false\n",
			modify:  func(c *config.Config) { c.MetricsSecure = false },
		},
		{
			name:    "empty URL disables an integration",
			content: "eventsServiceURL: \"\"\n",
			modify:  func(c *config.Config) { c.EventsServiceURL = "" },
		},
		{
			name:    "one field of a nested struct",
			content: "retryBackoff:\n  cap: 10m\n",
			modify:  func(c *config.Config) { c.RetryBackoff.Cap = duration(10 * time.Minute) },
		},
		{
			name:    "null nested struct",
			content: "gc: null\n",
			modify:  func(*config.Config) {},
		},
		{
			name:    "bare zero disables gc",
			content: "gc:\n  interval: 0\n  maxTTL: 0\n",
			modify: func(c *config.Config) {
				c.GC.Interval, c.GC.MaxTTL = duration(0), duration(0)
			},
		},
		{
			name:    "numeric-looking string value",
			content: "cluster: 1234\n",
			modify:  func(c *config.Config) { c.Cluster = "1234" },
		},
		{
			name:    "storage prefixes",
			content: "storage:\n  allowedPrefixes:\n    - s3://flyte-data/{project}/{domain}/\n    - file:///srv/flyte\n",
			modify: func(c *config.Config) {
				c.Storage.AllowedPrefixes = []string{"s3://flyte-data/{project}/{domain}/", "file:///srv/flyte"}
			},
		},
		{
			name:    "queue weights",
			content: "queueWeights:\n  prod: 4\n  batch: 1\n",
			modify: func(c *config.Config) {
				c.QueueWeights = map[string]int{"prod": 4, "batch": 1}
			},
		},
		{
			name:    "task type mapping",
			content: "defaultForTaskTypes:\n  python-task: container\n",
			modify: func(c *config.Config) {
				c.DefaultForTaskTypes = map[string]string{"python-task": "container"}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want := config.Default()
			tt.modify(&want)

			got, err := config.Load(writeFile(t, tt.content))
			if err != nil {
				t.Fatalf("Load() error = %v", err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("Load() =\n%+v\nwant\n%+v", got, want)
			}
		})
	}
}

func TestLoadRejects(t *testing.T) {
	tests := []struct {
		name    string
		content string
		want    string // a substring of the error, normally the offending field's YAML path
	}{
		{"unknown field", "maxConcurrentReconcile: 4\n", `unknown field "maxConcurrentReconcile"`},
		{"unknown nested field", "gc:\n  ttl: 1h\n", "gc.ttl: unknown field"},
		{"duplicate key", "cluster: a\ncluster: b\n", "cluster"},
		{"no bound on the events backlog", "eventsBacklog:\n  maxUndeliveredFinished: 0\n", "eventsBacklog.maxUndeliveredFinished: must be at least 1 (there is no unbounded setting), got 0"},
		{"negative bound on the events backlog", "eventsBacklog:\n  maxUndeliveredFinished: -1\n", "eventsBacklog.maxUndeliveredFinished: must be at least 1"},
		{"negative refusals before events are given up", "eventsDelivery:\n  maxRefusals: -1\n", "eventsDelivery.maxRefusals: must not be negative"},
		{"gc interval set with maxTTL 0", "gc:\n  interval: 5m\n  maxTTL: 0s\n", "gc.maxTTL: must be positive when gc.interval is set"},
		{"file storage mounted without a file prefix", "k8s:\n  mountFileStorage: true\nstorage:\n  allowedPrefixes: [\"s3://b/\"]\n", "k8s.mountFileStorage: needs a file:// prefix"},
		{"negative missing secret grace period", "k8s:\n  missingSecretGracePeriod: -1s\n", "k8s.missingSecretGracePeriod: must not be negative"},
		{"device fault pattern that is no regular expression", "k8s:\n  deviceFaults:\n    patterns: [{name: x, message: 'Xid ('}]\n",
			"k8s.deviceFaults.patterns[0].message: not a regular expression (RE2)"},
		{"negative late event wait", "k8s:\n  deviceFaults:\n    lateEventWait: -1s\n", "k8s.deviceFaults.lateEventWait: must not be negative"},
		{"negative image pull grace period", "k8s:\n  imagePullGracePeriod: -1s\n", "k8s.imagePullGracePeriod: must not be negative"},
		{"negative gc interval", "gc:\n  interval: -1m\n", "gc.interval: must not be negative"},
		{"negative gc maxTTL", "gc:\n  maxTTL: -1h\n", "gc.maxTTL: must not be negative"},
		{"negative gc bound", "gc:\n  maxFinishedPerNamespace: -1\n", "gc.maxFinishedPerNamespace: must not be negative"},
		{"gc bound not a number", "gc:\n  maxFinished: lots\n", "gc.maxFinished: must be a number"},
		{"negative gc delete rate", "gc:\n  deletesPerSecond: -5\n", "gc.deletesPerSecond: must not be negative"},
		{"maxConcurrentReconciles 0", "maxConcurrentReconciles: 0\n", "maxConcurrentReconciles: must be at least 1"},
		{"log link template that does not parse", "logLinks:\n  - name: k\n    uriTemplate: \"{{.Pod\"\n", "logLinks[0].uriTemplate"},
		{"log link that renders no URI", "logLinks:\n  - name: k\n    uriTemplate: \"{{.PodName}}\"\n", "logLinks[0].uriTemplate: must render an absolute URI"},
		{"log link with an unknown field", "logLinks:\n  - name: k\n    uriTemplate: \"https://x/{{.Pod}}\"\n", "logLinks[0].uriTemplate: does not render"},
		{"nine log links", "logLinks:\n" + strings.Repeat("  - {name: k, uriTemplate: \"https://x/\"}\n", 9), "logLinks: at most 8"},
		{"long cluster name", "cluster: " + strings.Repeat("c", 254) + "\n", "cluster: at most 253"},
		{"cache per cluster without a cluster", "cacheSharing: cluster\n", `cacheSharing: "cluster" needs cluster set`},
		{"unknown cache sharing", "cluster: east\ncacheSharing: everyone\n", `cacheSharing: want "shared" or "cluster", got "everyone"`},
		{"log link without a name", "logLinks:\n  - uriTemplate: https://x/{{.PodName}}\n", "logLinks[0].name"},
		{"maxSystemFailures -1", "maxSystemFailures: -1\n", "maxSystemFailures: must not be negative"},
		{"maxSystemFailures 101", "maxSystemFailures: 101\n", "maxSystemFailures: at most 100"},
		{"backoff base 0", "retryBackoff:\n  base: 0s\n", "retryBackoff.base: must be positive"},
		{"backoff cap below base", "retryBackoff:\n  base: 10s\n  cap: 5s\n", "retryBackoff.cap: must be at least retryBackoff.base"},
		{"empty task type", "defaultForTaskTypes:\n  \"\": container\n", `defaultForTaskTypes[""]: task type must not be empty`},
		{"empty plugin ID", "defaultForTaskTypes:\n  python-task: \"\"\n", `defaultForTaskTypes["python-task"]: plugin ID must not be empty`},
		{"malformed duration", "gc:\n  interval: soon\n", `gc.interval: time: invalid duration "soon"`},
		{"malformed backoff duration", "retryBackoff:\n  cap: 5 minutes\n", "retryBackoff.cap"},
		{"bare number as duration", "retryBackoff:\n  base: 5\n", "retryBackoff.base: 5 is not a duration"},
		{"nested struct not a mapping", "gc: 30m\n", "gc: must be a mapping"},
		{"wrong scalar type", "maxConcurrentReconciles: many\n", "maxConcurrentReconciles"},
		{"bad service URL", "eventsServiceURL: localhost:8090\n", "eventsServiceURL: must be an http or https URL"},
		{"leader election without ID", "leaderElect: true\nleaderElectionID: \"\"\n", "leaderElectionID: must be set when leaderElect is true"},
		{"cert path without cert name", "metricsCertPath: /certs\nmetricsCertName: \"\"\n", "metricsCertName: must be set when metricsCertPath is set"},
		{"negative default CPU", "k8s:\n  defaultCpuRequest: -1\n", "k8s.defaultCpuRequest: must not be negative"},
		{"malformed quantity", "k8s:\n  defaultMemoryRequest: lots\n", "defaultMemoryRequest"},
		{"bad default label key", "k8s:\n  defaultLabels: {\"bad key\": x}\n", `k8s.defaultLabels["bad key"]: not a valid key`},
		{"bad default label value", "k8s:\n  defaultLabels: {team: \"a b\"}\n", `k8s.defaultLabels["team"]: not a valid value`},
		{"bad node selector key", "k8s:\n  interruptibleNodeSelector: {\"/x\": \"y\"}\n", `k8s.interruptibleNodeSelector["/x"]`},
		{"unknown k8s field", "k8s:\n  defaultCPU: 1\n", "unknown field"},
		// Fields of the plugins' settings that the executor fills in are no keys.
		{"k8s log links", "k8s:\n  logLinks: []\n", `k8s: json: unknown field "logLinks"`},
		{"k8s executor namespace", "k8s:\n  executorNamespace: flyte\n", `k8s: json: unknown field "executorNamespace"`},
		{"k8s pod templates as a section", "k8s:\n  config: {defaultPodTemplateName: x}\n", `k8s: json: unknown field "config"`},
		{"interruptible threshold below the system budget", "maxSystemFailures: 3\nk8s:\n  interruptibleFailureThreshold: -4\n",
			"k8s.interruptibleFailureThreshold: must not be below -maxSystemFailures (-3), got -4"},
		{"bad default pod template name", "k8s:\n  defaultPodTemplateName: GPU_default\n", "k8s.defaultPodTemplateName: not a valid name"},
		{"restricted inline pod templates", "k8s:\n  inlinePodTemplateLevel: restricted\n", "k8s.inlinePodTemplateLevel: must be baseline or privileged"},
		{"a namespace template without the project", "tenancy:\n  namespaceTemplate: shared\n", "tenancy: namespaceTemplate \"shared\" lacks {project}"},
		{"inline pod template field that is no PodSpec field", "k8s:\n  inlinePodTemplateFields: [containers, tolerationz]\n",
			`k8s.inlinePodTemplateFields[1]: "tolerationz" is not a field of a PodSpec`},
		{"inline pod template field in the wrong case", "k8s:\n  inlinePodTemplateFields: [NodeSelector]\n",
			`k8s.inlinePodTemplateFields[0]: "NodeSelector" is not a field of a PodSpec`},
		{"inline pod template field listed twice", "k8s:\n  inlinePodTemplateFields: [volumes, volumes]\n",
			`k8s.inlinePodTemplateFields[1]: "volumes" is listed twice`},
		{"unknown storage field", "storage:\n  prefixes: [s3://b/]\n", "unknown field"},
		{"prefix that is no URI", "storage:\n  allowedPrefixes: [data/]\n", "storage.allowedPrefixes[0]: \"data/\" is not an absolute URI"},
		{"the whole file system", "storage:\n  allowedPrefixes: [s3://b/, \"file:///\"]\n", "storage.allowedPrefixes[1]: \"file:///\" opens the whole file system"},
		{"the executor's own secrets", "storage:\n  allowedPrefixes: [file:///var/run/secrets/]\n", "storage.allowedPrefixes[0]: \"file:///var/run/secrets/\": the system directory /var/run"},
		{"unknown placeholder", "storage:\n  allowedPrefixes: [\"s3://b/{team}/\"]\n", "storage.allowedPrefixes[0]: \"s3://b/{team}/\": unknown placeholder {team}"},
		{"duplicate prefix", "storage:\n  allowedPrefixes: [s3://b/x, s3://b/x/]\n", "storage.allowedPrefixes[1]: s3://b/x/ is listed twice"},
		{"no document at all", "storage:\n  maxDocumentBytes: 0\n", "storage.maxDocumentBytes: must be from 1024 to 268435456, got 0"},
		{"documents beyond memory", "storage:\n  maxDocumentBytes: 1Gi\n", "storage.maxDocumentBytes: must be from 1024 to 268435456"},
		{"no copy at all", "storage:\n  maxCopyBytes: 10\n", "storage.maxCopyBytes: must be from 1024"},
		{"no output entries", "storage:\n  maxOutputEntries: 0\n", "storage.maxOutputEntries: must be from 1"},
		{"outputs too deep to walk", "storage:\n  maxOutputDepth: 5000\n", "storage.maxOutputDepth: must be from 1 to 1024, got 5000"},
		{"no call deadline", "storage:\n  callTimeout: 0s\n", "storage.callTimeout: must be positive"},
		{"copies shorter than calls", "storage:\n  callTimeout: 1m\n  copyTimeout: 30s\n", "storage.copyTimeout: must be at least storage.callTimeout (1m0s), got 30s"},
		{"missing token file", "serviceTokenFile: /nonexistent/token\n", "serviceTokenFile: open /nonexistent/token: no such file"},
		{"missing CA file", "serviceCAFile: /nonexistent/ca.pem\neventsServiceURL: https://events\ncacheServiceURL: https://cache\n", "serviceCAFile: open /nonexistent/ca.pem: no such file"},
		{"a removed webhook field", "webhookCertPath: /certs\nwebhookCertName: tls.crt\n", "webhookCertName: removed: the executor serves no webhook. An action's secrets are delivered to its pod by the kubelet (spec.secrets); docs/configuration.md says why; webhookCertPath: removed"},
		{"a namespace that is no name", "namespaces: [Team_A]\n", `namespaces[0]: "Team_A" is not a namespace name`},
		{"a namespace twice", "namespaces: [a, b, a]\n", `namespaces[2]: "a" is listed twice`},
		{"an empty namespace", "namespaces: [\"\"]\n", `namespaces[0]: "" is not a namespace name`},
		{"an executor namespace that is no name", "executorNamespace: flyte/system\n", `executorNamespace: "flyte/system" is not a namespace name`},
		{"non-YAML content", "{ this is: [not yaml\n", "config.yaml"},
		{"YAML that is not a mapping", "- a\n- b\n", "config.yaml"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := writeFile(t, tt.content)
			_, err := config.Load(path)
			if err == nil {
				t.Fatalf("Load() succeeded, want an error containing %q", tt.want)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Load() error = %q, want it to contain %q", err, tt.want)
			}
			if !strings.Contains(err.Error(), path) {
				t.Errorf("Load() error = %q, want it to name the file %q", err, path)
			}
		})
	}
}

// TestLoadRejectsServiceCredentials: the files must be usable at start, and a CA bundle
// means the services are reached over https.
func TestLoadRejectsServiceCredentials(t *testing.T) {
	dir := t.TempDir()
	file := func(name, content string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	ca, token := file("ca.pem", testCA(t)), file("token", "t0k3n\n")
	tests := []struct {
		name    string
		content string
		want    string
	}{
		{"empty token file", "serviceTokenFile: " + file("empty", " \n"), "serviceTokenFile: " + dir + "/empty is empty"},
		{"token file is a directory", "serviceTokenFile: " + dir, "serviceTokenFile: read " + dir + ": is a directory"},
		{"CA file without a certificate", "serviceCAFile: " + token + "\neventsServiceURL: https://events:8090\ncacheServiceURL: \"\"", "serviceCAFile: " + token + " holds no PEM certificate"},
		{"CA file with plain http to the events service", "serviceCAFile: " + ca + "\ncacheServiceURL: \"\"", `eventsServiceURL: must be an https URL when serviceCAFile is set, got "http://localhost:8090"`},
		{"CA file with plain http to the cache service", "serviceCAFile: " + ca + "\neventsServiceURL: https://events:8090", `cacheServiceURL: must be an https URL when serviceCAFile is set, got "http://localhost:8094"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := config.Load(writeFile(t, tt.content+"\n"))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Load() error = %v, want it to contain %q", err, tt.want)
			}
		})
	}
	if _, err := config.Load(writeFile(t, "serviceTokenFile: "+token+"\nserviceCAFile: "+ca+"\neventsServiceURL: https://events:8090\ncacheServiceURL: https://cache:8094\n")); err != nil {
		t.Fatalf("usable files: %v", err)
	}
}

// testCA is a PEM certificate authority, as a cluster's CA bundle would hold.
func testCA(t *testing.T) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "flyte test CA"},
		NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}

func TestLoadMissingFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "absent.yaml")
	_, err := config.Load(path)
	if err == nil || !strings.Contains(err.Error(), path) {
		t.Errorf("Load(%q) error = %v, want one naming the file", path, err)
	}
}

// TestInterruptibleFailureThreshold: the threshold counts system failures, so it must be
// one an action can reach: a positive one at most maxSystemFailures, a negative one
// counting back no further than it.
func TestInterruptibleFailureThreshold(t *testing.T) {
	for _, tt := range []struct {
		threshold, maxSystemFailures int
		want                         string // empty: valid
	}{
		{threshold: 0, maxSystemFailures: 0},
		{threshold: 1, maxSystemFailures: 3},
		{threshold: 3, maxSystemFailures: 3},
		{threshold: -1, maxSystemFailures: 3},
		{threshold: -3, maxSystemFailures: 3},
		{threshold: 4, maxSystemFailures: 3, want: "k8s.interruptibleFailureThreshold: must not exceed maxSystemFailures (3), got 4"},
		{threshold: 1, maxSystemFailures: 0, want: "k8s.interruptibleFailureThreshold: must not exceed maxSystemFailures (0), got 1"},
		{threshold: -4, maxSystemFailures: 3, want: "k8s.interruptibleFailureThreshold: must not be below -maxSystemFailures (-3), got -4"},
		{threshold: -1, maxSystemFailures: 0, want: "k8s.interruptibleFailureThreshold: must not be below -maxSystemFailures (0), got -1"},
	} {
		t.Run(fmt.Sprintf("%d of %d", tt.threshold, tt.maxSystemFailures), func(t *testing.T) {
			c := config.Default()
			c.K8s.InterruptibleFailureThreshold, c.MaxSystemFailures = tt.threshold, tt.maxSystemFailures
			err := c.Validate()
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("Validate() = %v, want nil", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("Validate() = %v, want it to contain %q", err, tt.want)
			}
		})
	}
}

func TestValidateReportsEveryProblem(t *testing.T) {
	c := config.Default()
	c.MaxConcurrentReconciles = 0
	c.GC.MaxTTL = duration(0)
	c.DefaultForTaskTypes = map[string]string{"": ""}
	c.QueueWeights = map[string]int{"Prod": 1, "batch": 0, "ml": 101}

	err := c.Validate()
	if err == nil {
		t.Fatal("Validate() = nil, want errors")
	}
	for _, want := range []string{
		"maxConcurrentReconciles: must be at least 1",
		"gc.maxTTL: must be positive when gc.interval is set",
		`defaultForTaskTypes[""]: task type must not be empty`,
		`defaultForTaskTypes[""]: plugin ID must not be empty`,
		`queueWeights["Prod"]: not a namespace name`,
		`queueWeights["batch"]: must be from 1 to 100, got 0`,
		`queueWeights["ml"]: must be from 1 to 100, got 101`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %q, want it to contain %q", err, want)
		}
	}
}

func TestDefaultReturnsIndependentValues(t *testing.T) {
	a := config.Default()
	a.DefaultForTaskTypes = map[string]string{"x": "y"}
	a.GC.Interval = duration(time.Second)
	if b := config.Default(); b.DefaultForTaskTypes != nil || b.GC.Interval.Duration != 10*time.Second {
		t.Errorf("changing one Default() result changed another: %+v", b)
	}
}

// TestDocumentedExampleLoads: the complete example in docs/configuration.md (kept as a
// file) is a valid configuration.
func TestDocumentedExampleLoads(t *testing.T) {
	path, err := repo.Path("docs", "examples", "executor-config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := config.Load(path); err != nil {
		t.Fatal(err)
	}
}

// TestLoadFilesLayers: each file is decoded over what the files before it (and the
// defaults) gave, as JSON into an existing struct: a key a later file names wins, one it
// leaves out keeps the earlier value, nested structs and maps merge member by member,
// lists are replaced whole. Validation sees only the result.
func TestLoadFilesLayers(t *testing.T) {
	tests := []struct {
		name   string
		files  []string
		modify func(*config.Config) // applied to Default(): the want
		err    string               // a substring of the error, instead
		errIn  int                  // the file the error must name, when err is set; -1: every file
	}{
		{
			name:   "no files",
			modify: func(*config.Config) {},
		},
		{
			name:  "a later file overrides, the rest keeps the earlier file's",
			files: []string{"cluster: a\nmaxConcurrentReconciles: 4\n", "metricsBindAddress: \":9090\"\nhealthProbeBindAddress: \":9091\"\ncluster: b\n"},
			modify: func(c *config.Config) {
				c.Cluster, c.MaxConcurrentReconciles, c.MetricsBindAddress, c.HealthProbeBindAddress = "b", 4, ":9090", ":9091"
			},
		},
		{
			name:  "three files, the last one wins",
			files: []string{"cluster: a\n", "cluster: b\n", "cluster: c\ndefaultServiceAccount: sa\n"},
			modify: func(c *config.Config) {
				c.Cluster, c.DefaultServiceAccount = "c", "sa"
			},
		},
		{
			name:   "an empty later file changes nothing",
			files:  []string{"cluster: a\n", ""},
			modify: func(c *config.Config) { c.Cluster = "a" },
		},
		{
			name:   "an empty path names no file",
			files:  []string{"cluster: a\n", "-"},
			modify: func(c *config.Config) { c.Cluster = "a" },
		},
		{
			name:  "a nested struct merges field by field",
			files: []string{"gc:\n  interval: 1m\n  maxFinished: 10\n", "gc:\n  maxTTL: 1h\n  deletesPerSecond: 5\n"},
			modify: func(c *config.Config) {
				c.GC = config.GCConfig{Interval: duration(time.Minute), MaxTTL: duration(time.Hour), MaxFinished: 10,
					MaxFinishedPerNamespace: c.GC.MaxFinishedPerNamespace, DeletesPerSecond: 5}
			},
		},
		{
			name:  "k8s merges field by field",
			files: []string{"k8s:\n  defaultCpuRequest: 250m\n  injectFinalizer: true\n", "k8s:\n  defaultMemoryRequest: 1Gi\n"},
			modify: func(c *config.Config) {
				c.K8s.DefaultCPURequest, c.K8s.DefaultMemoryRequest, c.K8s.InjectFinalizer = resource.MustParse("250m"), resource.MustParse("1Gi"), true
			},
		},
		{
			name:  "maps merge key by key",
			files: []string{"queueWeights: {prod: 4, batch: 2}\nk8s:\n  defaultLabels: {team: ml}\n", "queueWeights: {batch: 1, ml: 3}\nk8s:\n  defaultLabels: {tier: gold}\n"},
			modify: func(c *config.Config) {
				c.QueueWeights = map[string]int{"prod": 4, "batch": 1, "ml": 3}
				c.K8s.DefaultLabels = map[string]string{"team": "ml", "tier": "gold"}
			},
		},
		{
			name:  "a list is replaced whole",
			files: []string{"storage:\n  allowedPrefixes: [s3://a/, s3://b/]\nnamespaces: [team-a, team-b]\n", "storage:\n  allowedPrefixes: [gs://c/]\n"},
			modify: func(c *config.Config) {
				c.Storage.AllowedPrefixes, c.Namespaces = []string{"gs://c/"}, []string{"team-a", "team-b"}
			},
		},
		{
			name:  "a list of k8s's pod template keys is replaced whole",
			files: []string{"k8s:\n  inlinePodTemplateFields: [containers, volumes, os]\n", "k8s:\n  inlinePodTemplateFields: [volumes]\n"},
			modify: func(c *config.Config) {
				c.K8s.InlinePodTemplateFields = []string{"volumes"}
			},
		},
		{
			name:   "an empty list replaces a list",
			files:  []string{"namespaces: [team-a, team-b]\n", "namespaces: []\n"},
			modify: func(c *config.Config) { c.Namespaces = []string{} },
		},
		{
			// encoding/json alone would decode the later element into the earlier one,
			// keeping the uriTemplate and the toleration's value and effect.
			name: "a list's elements are not merged",
			files: []string{
				"logLinks:\n  - {name: A, uriTemplate: \"https://a/{{.PodName}}\"}\n  - {name: B, uriTemplate: \"https://b/{{.PodName}}\"}\n" +
					"k8s:\n  interruptibleTolerations:\n    - {key: spot, operator: Equal, value: \"true\", effect: NoSchedule}\n",
				"logLinks:\n  - {name: C, uriTemplate: \"https://c/{{.PodName}}\"}\nk8s:\n  interruptibleTolerations:\n    - {key: preemptible, operator: Exists}\n",
			},
			modify: func(c *config.Config) {
				c.LogLinks = []config.LogLink{{Name: "C", URITemplate: "https://c/{{.PodName}}"}}
				c.K8s.InterruptibleTolerations = []corev1.Toleration{{Key: "preemptible", Operator: corev1.TolerationOpExists}}
			},
		},
		{
			name:  "a later element missing a field is not completed by an earlier one",
			files: []string{"logLinks:\n  - {name: A, uriTemplate: \"https://a/{{.PodName}}\"}\n", "logLinks:\n  - {name: C}\n"},
			err:   "logLinks[0].uriTemplate", errIn: -1,
		},
		{
			// encoding/json matches keys ignoring case, so the list is named all the same.
			name:  "a list named in another case is replaced whole too",
			files: []string{"logLinks:\n  - {name: A, uriTemplate: \"https://a/{{.PodName}}\"}\n", "LogLinks:\n  - {name: C}\n"},
			err:   "logLinks[0].uriTemplate", errIn: -1,
		},
		{
			name:  "a bad value in file 1 fixed by file 2 passes",
			files: []string{"maxConcurrentReconciles: 0\ngc:\n  interval: 5m\n  maxTTL: 0s\n", "maxConcurrentReconciles: 2\ngc:\n  maxTTL: 1h\n"},
			modify: func(c *config.Config) {
				c.MaxConcurrentReconciles, c.GC.Interval, c.GC.MaxTTL = 2, duration(5*time.Minute), duration(time.Hour)
			},
		},
		{
			name:  "a value valid alone that file 2 makes invalid fails",
			files: []string{"maxSystemFailures: 3\nk8s:\n  interruptibleFailureThreshold: 2\n", "maxSystemFailures: 1\n"},
			err:   "k8s.interruptibleFailureThreshold: must not exceed maxSystemFailures (1), got 2", errIn: -1,
		},
		{
			name:  "an unknown field in file 2",
			files: []string{"cluster: a\n", "clustr: b\n"},
			err:   `unknown field "clustr"`, errIn: 1,
		},
		{
			name:  "an unknown nested field in file 2",
			files: []string{"gc:\n  interval: 1m\n", "gc:\n  ttl: 1h\n"},
			err:   "gc.ttl: unknown field", errIn: 1,
		},
		{
			name:  "a malformed value in file 1",
			files: []string{"retryBackoff:\n  cap: soon\n", "cluster: a\n"},
			err:   "retryBackoff.cap", errIn: 0,
		},
		{
			name:  "a removed field in file 2",
			files: []string{"", "webhookCertPath: /certs\n"},
			err:   "webhookCertPath: removed", errIn: 1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			var paths []string
			for i, content := range tt.files {
				if content == "-" {
					paths = append(paths, "")
					continue
				}
				path := filepath.Join(dir, fmt.Sprintf("%d.yaml", i+1))
				if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
					t.Fatal(err)
				}
				paths = append(paths, path)
			}
			got, err := config.LoadFiles(paths...)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("LoadFiles() error = %v, want it to contain %q", err, tt.err)
				}
				for i, path := range paths {
					if names := strings.Contains(err.Error(), path); names != (tt.errIn == -1 || tt.errIn == i) {
						t.Errorf("LoadFiles() error = %q: names %s %v, want %v", err, path, names, !names)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("LoadFiles() error = %v", err)
			}
			want := config.Default()
			tt.modify(&want)
			if !reflect.DeepEqual(got, want) {
				t.Errorf("LoadFiles() =\n%+v\nwant\n%+v", got, want)
			}
		})
	}
}

// TestLoadIsLoadFilesOfOne: one file (or none) loads as it always has.
func TestLoadIsLoadFilesOfOne(t *testing.T) {
	for _, content := range []string{"cluster: a\ngc:\n  maxTTL: 1h\n", "maxConcurrentReconciles: 0\n", "clustr: a\n"} {
		path := writeFile(t, content)
		got, err := config.Load(path)
		gotFiles, errFiles := config.LoadFiles(path)
		if !reflect.DeepEqual(got, gotFiles) || fmt.Sprint(err) != fmt.Sprint(errFiles) {
			t.Errorf("%q: Load() = %+v, %v; LoadFiles() = %+v, %v", content, got, err, gotFiles, errFiles)
		}
	}
	if _, err := config.LoadFiles(); err != nil {
		t.Errorf("LoadFiles() = %v, want the defaults", err)
	}
}
