package v1

// Limits of the status, in one place. The CRD's markers must carry the same numbers (a
// marker cannot name a constant); TestLimitsMatchTheCRD checks that they do. Code that
// writes the status cuts text to these (in bytes, which never exceeds the schema's
// characters).
const (
	// MaxReasonLength bounds a history entry's reason and a cluster event's reason.
	MaxReasonLength = 256
	// MaxHistoryMessageLength bounds a history entry's message.
	MaxHistoryMessageLength = 1024
	// MaxErrorCodeLength and MaxErrorMessageLength bound an execution error.
	MaxErrorCodeLength    = 256
	MaxErrorMessageLength = 4096
	// MaxLogLinks bounds the log links of one history entry; MaxLogLinkNameLength and
	// MaxLogLinkURILength bound each.
	MaxLogLinks          = 8
	MaxLogLinkNameLength = 128
	MaxLogLinkURILength  = 2048
	// MaxClusterEvents bounds the Kubernetes events of one history entry; the others
	// bound each event's fields.
	MaxClusterEvents             = 10
	MaxClusterEventObjectLength  = 512
	MaxClusterEventTypeLength    = 32
	MaxClusterEventMessageLength = 1024
	// MaxClusterEventSourceLength bounds the component that reported an event. Their
	// names are short ("kubelet", "default-scheduler"); a longer one is cut.
	MaxClusterEventSourceLength = 128
	// MaxConditionMessageLength is metav1.Condition's own limit on a message.
	MaxConditionMessageLength = 32768
)

// Limits of the spec. Every action's spec is held in the executor's informer, and most of
// it again in its pod, for as long as the action exists: unbounded, one action of a 1.3 MB
// argument, two hundred times, took the executor to a GiB. The numbers are in characters
// (what the schema's maxLength and CEL's size() count; UTF-8 takes at most 4 bytes for
// one), far above what a real task writes: Flyte's commands are a few KB, and a task's
// data goes through inputUri, not its command line. docs/executor.md has the table.
// The CRD's markers and rules carry the same numbers; TestLimitsMatchTheCRD checks them.
const (
	// MaxTimeoutLength bounds timeout, a duration such as "1h30m": a duration may
	// repeat its units ("1s0s0s..."), so without it the field is a string of any length.
	MaxTimeoutLength = 64

	// MaxArgs bounds the items of container.command, and those of container.args.
	MaxArgs = 256
	// MaxArgLength bounds one item of command or args: a path, a URI, a flag, a module
	// name. Linux refuses longer than 128 KiB for one argument anyway.
	MaxArgLength = 32 << 10
	// MaxCommandLineLength bounds command and args together: 30 times a long Flyte
	// command (pyflyte-fast-execute with its distribution, resolver and inputs).
	MaxCommandLineLength = 128 << 10

	// MaxEnv bounds container.env, and MaxEnvVars envVars.
	MaxEnv     = 128
	MaxEnvVars = 128
	// MaxEnvNameLength bounds a variable's name, in env and envVars (and secrets' env).
	MaxEnvNameLength = 256
	// MaxReferenceLength bounds each name in env[].valueFrom: a Secret's or ConfigMap's
	// name and key (DNS subdomains, at most 253), a fieldPath, a resource, a file's path.
	MaxReferenceLength = 253

	// MaxValueLength bounds one value of env, envVars, config and the pods' annotations.
	MaxValueLength = 32 << 10

	// MaxConfig bounds config's entries.
	MaxConfig = 64
	// MaxKeyLength bounds a key of config and of the pods' labels and annotations: a
	// Kubernetes qualified name is a 253-character prefix, a slash and 63 characters.
	MaxKeyLength = 317
	// MaxPodLabels and MaxPodAnnotations bound podTemplate.metadata.
	MaxPodLabels      = 64
	MaxPodAnnotations = 64
	// MaxLabelValueLength is Kubernetes' own limit on a label's value: a longer one
	// would only fail when the pod is created.
	MaxLabelValueLength = 63

	// MaxSecrets bounds spec.secrets; each of its fields has its own limit.
	MaxSecrets = 64

	// MaxIgnoredInputs bounds cache.ignoredInputs, and MaxIgnoredInputLength each name.
	MaxIgnoredInputs      = 64
	MaxIgnoredInputLength = 256

	// MaxResourceNames bounds the entries of container.resources' limits, and those of
	// its requests; MaxResourceNameLength is a qualified name's length.
	MaxResourceNames      = 16
	MaxResourceNameLength = 317
	// MaxQuantityLength bounds a quantity written as a string ("500m", "16Gi").
	MaxQuantityLength = 64
	// MaxResourceClaims bounds container.resources.claims; their names are DNS labels.
	MaxResourceClaims = 16

	// MaxSpecTextLength bounds the spec's long texts together: command and args, the
	// names and values of env, envVars, config and the annotations, and secrets'
	// mountPaths. With the other fields' limits (labels 24 K, secrets' other fields
	// 48 K, ignoredInputs 16 K, resources 20 K, env's valueFrom 97 K, the rest 7 K), a
	// spec has at most 475 K characters, under a third of the 1.5 MiB Kubernetes allows
	// an object; except for podTemplate.spec: the API server cannot measure a
	// schemaless field (see the PodTemplate type), so the executor bounds it when it
	// reads it.
	MaxSpecTextLength = 256 << 10
)
