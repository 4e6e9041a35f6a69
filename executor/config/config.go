// Package config holds the executor's configuration: the settings read from the YAML files
// named by --config, each layered over the ones before it. Defaults live in Default, so a
// deployment only spells out what it changes, and Validate runs at start-up so a bad value
// stops the executor with a message naming the field, instead of surfacing later as odd
// behaviour mid-reconcile.
package config

import (
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flytekube/backend/executor/pluginmachinery/k8s"
	"github.com/flytekube/backend/executor/pluginmachinery/k8s/podtemplate"
	"github.com/flytekube/backend/executor/tenancy"
)

// Config is the executor's configuration. The json tags are the YAML keys, because
// sigs.k8s.io/yaml decodes YAML by way of JSON.
type Config struct {
	// MetricsBindAddress is where the metrics server listens; "0" turns it off. Default ":10254".
	MetricsBindAddress string `json:"metricsBindAddress"`
	// MetricsSecure serves metrics over HTTPS, with authentication and authorisation.
	// Default true.
	MetricsSecure bool `json:"metricsSecure"`
	// MetricsCertPath is the directory holding the metrics server's certificate; empty
	// means a self-signed certificate is generated. Default "".
	MetricsCertPath string `json:"metricsCertPath"`
	// MetricsCertName is the certificate's file name within MetricsCertPath. Default "tls.crt".
	MetricsCertName string `json:"metricsCertName"`
	// MetricsCertKey is the private key's file name within MetricsCertPath. Default "tls.key".
	MetricsCertKey string `json:"metricsCertKey"`

	// HealthProbeBindAddress is where the liveness and readiness probes are served; "0"
	// turns them off. Default ":8081".
	HealthProbeBindAddress string `json:"healthProbeBindAddress"`

	// LeaderElect makes replicas elect a leader, so that only one reconciles at a time.
	// Default false.
	LeaderElect bool `json:"leaderElect"`
	// LeaderElectionID names the lock the replicas compete for. Default "abf369a8.flyte.org".
	LeaderElectionID string `json:"leaderElectionID"`
	// LeaderElectionNamespace holds the lock; empty means the namespace the executor runs
	// in. Default "".
	LeaderElectionNamespace string `json:"leaderElectionNamespace"`

	// Namespaces are the namespaces whose actions this executor runs, and the only ones
	// it creates pods and jobs in: its informers watch these alone, so its RBAC can be
	// RoleBindings in them instead of a ClusterRoleBinding. Empty means every namespace.
	// Default empty.
	Namespaces []string `json:"namespaces,omitempty"`
	// ExecutorNamespace is the namespace the executor runs in, the only one where the
	// plugins' SecretManager reads Secrets (credentials of the executor's own; an
	// action's secrets are delivered to its pod by the kubelet and never read). Default
	// the namespace of the pod's service account, or none outside a pod.
	ExecutorNamespace string `json:"executorNamespace"`

	// EnableHTTP2 allows HTTP/2 on the metrics server. It is off by default
	// because of the HTTP/2 stream-cancellation and rapid-reset vulnerabilities
	// (CVE-2023-44487, CVE-2023-39325). Default false.
	EnableHTTP2 bool `json:"enableHTTP2"`

	// EventsServiceURL is the base URL of the events service that action phase changes are
	// reported to. Empty disables reporting. Default "http://localhost:8090".
	EventsServiceURL string `json:"eventsServiceURL"`
	// CacheServiceURL is the base URL of the cache service consulted around cacheable
	// tasks. Empty disables caching: every task runs. Default "http://localhost:8094".
	CacheServiceURL string `json:"cacheServiceURL"`

	// ServiceTokenFile holds the bearer token sent to both services, such as a projected
	// ServiceAccount token with the services' audience. It is re-read as the kubelet
	// rotates it. Empty sends none. Default "".
	ServiceTokenFile string `json:"serviceTokenFile"`
	// ServiceCAFile is a PEM bundle of the certificate authorities trusted for the
	// services' https:// URLs, instead of the system's; with it, both URLs must be https.
	// Default "".
	ServiceCAFile string `json:"serviceCAFile"`

	// Storage limits where actions' inputs and outputs may be read and written.
	Storage StorageConfig `json:"storage"`

	// Tenancy ties each namespace to the project (and domain) its actions may name.
	Tenancy TenancyConfig `json:"tenancy"`

	// Cluster identifies this executor's cluster in the action events it sends, so that
	// events from several clusters can be told apart. Default "".
	Cluster string `json:"cluster"`

	// CacheSharing says which executors' cache entries are hits here: "shared" (every
	// executor of the cache service: clusters that share the data store their outputs
	// are in, as one cluster does), or "cluster" (this cluster's alone, whose data store
	// the others cannot read; needs cluster). Default "shared".
	CacheSharing string `json:"cacheSharing"`

	// DefaultServiceAccount is the service account for task pods whose task names none;
	// empty means the namespace's default service account. Default "".
	DefaultServiceAccount string `json:"defaultServiceAccount"`

	// MaxSystemFailures is how many system failures (infrastructure errors, as opposed to
	// the task's own) an action survives before it fails permanently. Default 3.
	MaxSystemFailures int `json:"maxSystemFailures"`

	// MaxConcurrentReconciles bounds how many actions are reconciled at once. Default 8:
	// reconciles mostly wait on the API server and the services, so workers overlap, but
	// every worker's writes queue in the API server before another namespace's, so more
	// workers than the API server writes at once only make interactive actions wait
	// (docs/benchmarks.md, "Scale"). Raise it with the control plane's write capacity.
	MaxConcurrentReconciles int `json:"maxConcurrentReconciles"`

	// QueueWeights weighs namespaces in the work queue, which serves the namespaces with
	// actions waiting in turn, each as many actions in a row as its weight (default 1):
	// {"prod": 4} gives prod four actions for every one of each other namespace with
	// work waiting. Weights run from 1 to MaxQueueWeight.
	QueueWeights map[string]int `json:"queueWeights,omitempty"`

	// RetryBackoff spaces out the attempts of a failing action.
	RetryBackoff RetryBackoff `json:"retryBackoff"`

	// GC removes finished actions once they are old enough.
	GC GCConfig `json:"gc"`

	// EventsBacklog bounds what an events outage piles up in the API server.
	EventsBacklog EventsBacklogConfig `json:"eventsBacklog"`

	// EventsDelivery says what becomes of events the events service refuses.
	EventsDelivery EventsDeliveryConfig `json:"eventsDelivery"`

	// DefaultForTaskTypes picks the plugin, by ID, that runs each task type, such as
	// {"python-task": "container"}. Default empty.
	DefaultForTaskTypes map[string]string `json:"defaultForTaskTypes"`

	// LogLinks are links to a container task's logs, shown with its events: Go
	// templates over .Namespace, .PodName, .ContainerName, .Project, .Domain, .Run,
	// .Action and .Attempt. None by default.
	LogLinks []LogLink `json:"logLinks,omitempty"`

	// K8s holds what the Kubernetes plugins (container, k8s-job) apply to every object
	// they create. The plugins take it as is; its LogLinks and ExecutorNamespace, no
	// keys of the section, are filled in when the executor starts.
	K8s k8s.Config `json:"k8s"`
}

// MaxQueueWeight bounds a namespace's weight in the work queue: its turn is that many
// actions, so a weight much larger makes every other namespace wait as a backlog would.
const MaxQueueWeight = 100

// DefaultInlinePodTemplateFields is the default of k8s.inlinePodTemplateFields: what a
// task needs of its own pod, and what Pod Security's level judges (securityContext,
// host namespaces), so that k8s.inlinePodTemplateLevel decides on those.
var DefaultInlinePodTemplateFields = []string{
	"containers", "initContainers", "volumes", "securityContext", "hostNetwork", "hostPID", "hostIPC", "hostUsers",
	"nodeSelector", "terminationGracePeriodSeconds", "activeDeadlineSeconds", "dnsPolicy", "dnsConfig",
	"enableServiceLinks", "readinessGates", "os", "resources",
}

// StorageConfig limits the executor's data store. Cached outputs are copied only from
// where the action itself may read, so a forged cache entry cannot point an action at
// the executor's own files or at another project's data.
type StorageConfig struct {
	// AllowedPrefixes are the URI prefixes (s3://, gs://, file://, mem://) under which
	// actions' data may be read and written, such as "s3://flyte-data/{project}/{domain}/":
	// the placeholders give each project and domain its own part, which no other
	// project's or domain's action may read, even through a plain prefix that covers it.
	// Empty means each action may read only its inputUri and read and write only under
	// its runOutputBase (so cached outputs come only from its own run), and file:// only
	// under a prefix listed here. Default empty.
	AllowedPrefixes []string `json:"allowedPrefixes,omitempty"`

	// What a task's data may cost the executor: a task decides how large the objects it
	// leaves are (a sparse file costs it nothing), how many files its output holds, and
	// a store may stall; past a bound the action fails, naming it (docs/security.md).

	// MaxDocumentBytes bounds an object read into memory: error documents, and inputs
	// documents, which the cache hashes. Default 2Mi, Flyte's own bound on what it
	// downloads (storage.limits.maxDownloadMBs): documents of values, not data.
	MaxDocumentBytes resource.Quantity `json:"maxDocumentBytes"`
	// MaxCopyBytes bounds an object copied, streamed through a small buffer (cached
	// outputs, echoed inputs, a staged file:// input): memory stays flat, so this bounds
	// the disk and time a copy spends. Default 1Gi.
	MaxCopyBytes resource.Quantity `json:"maxCopyBytes"`
	// CallTimeout is the deadline of one call of the store (a read of at most
	// maxDocumentBytes, a write, an attribute lookup, opening a bucket); one exceeded is
	// transient: the pass is retried after a backoff without charging the action.
	// Default 30s: a healthy store answers in well under a second, and the SDKs' own
	// retries fit in it.
	CallTimeout metav1.Duration `json:"callTimeout"`
	// CopyTimeout is the deadline of one copy. Default 5m: maxCopyBytes' default at
	// 3.5 MiB/s, a slow store's pace.
	CopyTimeout metav1.Duration `json:"copyTimeout"`
	// MaxOutputEntries and MaxOutputDepth bound the tree a pod leaves in its staged
	// output (k8s.mountFileStorage): files and directories in all, and directories
	// nested. Defaults 10000 and 32: outputs are a document and a few files, 10000 are
	// moved in about a second, and 32 levels leave room for any layout a task means.
	MaxOutputEntries int `json:"maxOutputEntries"`
	MaxOutputDepth   int `json:"maxOutputDepth"`
}

// TenancyConfig ties an action's project and domain to its namespace: a namespace's
// actions may name only its project, which is the value of its ProjectLabel or, without
// one, the project whose name NamespaceTemplate turns into the namespace's. An action
// that names another fails at once (ProjectNotOfNamespace) before anything is read or
// written for it. The admission policy of deploy/kustomize/base/admission refuses the
// same actions with the default settings: change its variables with these.
type TenancyConfig struct {
	// ProjectLabel, on a namespace, names its project. Default "flyte.org/project".
	ProjectLabel string `json:"projectLabel"`
	// DomainLabel, on a namespace, names the one domain its actions may name; without
	// it, any domain of the project. Default "flyte.org/domain".
	DomainLabel string `json:"domainLabel"`
	// NamespaceTemplate makes the name of a namespace without ProjectLabel from the
	// project, {project}, and the domain, {domain}: "{project}" (a project's namespace
	// is named after it, as the services' authorization has it) or Flyte's
	// "{project}-{domain}". Its placeholders are not delimited in a name, so where
	// names could be read two ways ("a-b" of "a-b-c") label the namespaces instead.
	// Default "{project}".
	NamespaceTemplate string `json:"namespaceTemplate"`
}

// RetryBackoff is an exponential backoff with jitter, capped so that a long run of
// failures does not push retries out indefinitely.
type RetryBackoff struct {
	// Base is the delay before the first retry, doubled for each later one. Default 1s.
	Base metav1.Duration `json:"base"`
	// Cap is the longest delay between two attempts. Default 5m.
	Cap metav1.Duration `json:"cap"`
}

// GCConfig controls the garbage collection of finished actions. A finished action is
// deleted once its history is delivered to the events service, which keeps it, and
// either MaxTTL has passed or it is among the oldest over a bound.
type GCConfig struct {
	// Interval is how often garbage collection runs; 0 disables it. Default 10s.
	Interval metav1.Duration `json:"interval"`
	// MaxTTL is how long a finished action is kept before it is deleted. Default 5m.
	MaxTTL metav1.Duration `json:"maxTTL"`
	// MaxFinished bounds the finished actions held in all, MaxFinishedPerNamespace in
	// each namespace: over either, the oldest delivered go first. 0 is no bound.
	// Defaults 5000 and 2000.
	MaxFinished             int `json:"maxFinished"`
	MaxFinishedPerNamespace int `json:"maxFinishedPerNamespace"`
	// DeletesPerSecond spreads the deletes; 0 does not. Default 200: above the rate at
	// which actions finish, so that the bounds hold, and below what crowds out the
	// reconciler's writes.
	DeletesPerSecond float64 `json:"deletesPerSecond"`
}

// EventsBacklogConfig bounds the finished actions whose history waits for the events
// service: the collector keeps each until its history is delivered, so while the
// service is away every action that finishes stays in etcd and in the executor's
// memory. Past the bound, actions that have not started wait (Queued, reason
// EventsBacklog) while those already running go on; they start, fairly across
// namespaces, as the backlog is delivered. It applies only with an eventsServiceURL.
type EventsBacklogConfig struct {
	// MaxUndeliveredFinished is how many finished actions whose history is not yet
	// delivered may be stored before new actions wait. It must be at least 1: there is
	// no setting without a bound. Actions running when it is reached may still add to
	// it as they finish. Default 10000: 35 MB of etcd at the 3.5 KB a stored action
	// measured in docs/benchmarks.md, under 2 % of etcd's 2 GiB default quota, and
	// about as much of the executor's heap (docs/configuration.md has the arithmetic).
	MaxUndeliveredFinished int `json:"maxUndeliveredFinished"`
}

// EventsDeliveryConfig says what becomes of an action's events that the events service
// refuses (InvalidArgument, or too large even alone). An events service older than the
// executor refuses what it does not know until it is upgraded, so they are held and
// offered again, with a backoff of up to 5 minutes: the action stays undelivered, so the
// collector keeps it (a finished one counts toward eventsBacklog.maxUndeliveredFinished)
// and a deleted one keeps its finalizer.
type EventsDeliveryConfig struct {
	// MaxRefusals gives an action's events up after this many refusals in a row, so that
	// the action can go: lost to the events service, they stay in its status while it
	// exists. Default 0: never.
	MaxRefusals int `json:"maxRefusals"`
}

// Default returns the configuration used for every field the file leaves out. It builds a
// new value on each call, so callers may modify the result freely.
func Default() Config {
	return Config{
		MetricsBindAddress:      ":10254",
		MetricsSecure:           true,
		MetricsCertName:         "tls.crt",
		MetricsCertKey:          "tls.key",
		HealthProbeBindAddress:  ":8081",
		LeaderElectionID:        "abf369a8.flyte.org",
		EventsServiceURL:        "http://localhost:8090",
		CacheSharing:            CacheShared,
		CacheServiceURL:         "http://localhost:8094",
		MaxSystemFailures:       3,
		MaxConcurrentReconciles: 8,
		Tenancy: TenancyConfig{
			ProjectLabel:      tenancy.DefaultProjectLabel,
			DomainLabel:       tenancy.DefaultDomainLabel,
			NamespaceTemplate: tenancy.DefaultNamespaceTemplate,
		},
		RetryBackoff: RetryBackoff{
			Base: metav1.Duration{Duration: time.Second},
			Cap:  metav1.Duration{Duration: 5 * time.Minute},
		},
		Storage: StorageConfig{
			MaxDocumentBytes: resource.MustParse("2Mi"),
			MaxCopyBytes:     resource.MustParse("1Gi"),
			CallTimeout:      metav1.Duration{Duration: 30 * time.Second},
			CopyTimeout:      metav1.Duration{Duration: 5 * time.Minute},
			MaxOutputEntries: 10000,
			MaxOutputDepth:   32,
		},
		K8s: k8s.Config{
			DefaultCPURequest:        resource.MustParse("100m"),
			DefaultMemoryRequest:     resource.MustParse("128Mi"),
			ImagePullGracePeriod:     metav1.Duration{Duration: 3 * time.Minute},
			MissingSecretGracePeriod: metav1.Duration{Duration: 30 * time.Second},
			DeviceFaults: k8s.DeviceFaultConfig{
				Patterns:               k8s.DefaultDeviceFaultPatterns(),
				LateEventWait:          metav1.Duration{Duration: 30 * time.Second},
				DeviceResourcePrefixes: []string{"nvidia.com/"},
			},
			Config: podtemplate.Config{
				InlinePodTemplateLevel:  podtemplate.LevelBaseline,
				InlinePodTemplateFields: slices.Clone(DefaultInlinePodTemplateFields),
			},
		},
		GC: GCConfig{
			Interval:                metav1.Duration{Duration: 10 * time.Second},
			MaxTTL:                  metav1.Duration{Duration: 5 * time.Minute},
			MaxFinished:             5000,
			MaxFinishedPerNamespace: 2000,
			DeletesPerSecond:        200,
		},
		EventsBacklog: EventsBacklogConfig{MaxUndeliveredFinished: 10000},
	}
}

// Rule is the tenancy rule the configuration gives.
func (t TenancyConfig) Rule() tenancy.Rule {
	return tenancy.Rule{ProjectLabel: t.ProjectLabel, DomainLabel: t.DomainLabel, NamespaceTemplate: t.NamespaceTemplate}
}

// LogLink is a named template of a link to an attempt's logs.
type LogLink struct {
	// Name labels the link, such as "Kubernetes" or "Loki".
	Name string `json:"name"`
	// URITemplate is a text/template, such as
	// "https://logs.example.com/{{.Namespace}}/{{.PodName}}".
	URITemplate string `json:"uriTemplate"`
}

// The values of CacheSharing.
const (
	// CacheShared makes every executor's cache entries hits here.
	CacheShared = "shared"
	// CachePerCluster keeps this cluster's entries apart from the others'.
	CachePerCluster = "cluster"
)
