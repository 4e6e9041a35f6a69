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
