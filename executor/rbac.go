package executor

// The executor's permissions, as +kubebuilder:rbac markers from which `make crd-generate`
// writes the flyte-executor ClusterRole (deploy/kustomize/base/rbac/role.yaml). Keep them
// to what the code calls: a verb added here is a verb every cluster running the executor
// grants it.

// TaskActions: the controller reads them from the informer, writes their status (update),
// patches their finalizer and labels; the garbage collector lists and deletes them.
// Setting a TaskAction as a pod's blocking controller owner needs update on
// taskactions/finalizers.
// +kubebuilder:rbac:groups=flyte.org,resources=taskactions,verbs=get;list;watch;patch;delete
// +kubebuilder:rbac:groups=flyte.org,resources=taskactions/status,verbs=update
// +kubebuilder:rbac:groups=flyte.org,resources=taskactions/finalizers,verbs=update

// The objects Kubernetes plugins run actions as: pods (container plugin) and jobs.
// +kubebuilder:rbac:groups="",resources=pods,verbs=create;get;list;watch;delete;patch
// +kubebuilder:rbac:groups=batch,resources=jobs,verbs=create;get;list;watch;delete;patch

// Events: recorded on actions (core/v1, through GetEventRecorderFor), and the events
// about an attempt's pod listed by field selector.
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch;list

// Secrets a task asks for, read in the action's namespace.
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get

// Leader election, in the executor's own namespace only: a namespaced Role (the
// deployment's namespace replaces "flyte"; leaderElectionNamespace must stay there).
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;create;update,namespace=flyte

// The secure metrics endpoint authenticates scrapers and authorises them by RBAC.
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create
