package executor

// The executor's permissions outside the namespaces it runs actions in, as
// +kubebuilder:rbac markers from which `make crd-generate` writes the flyte-executor
// ClusterRole and Role (deploy/kustomize/base/rbac/role.yaml). What it may do in those
// namespaces is in package executor/rbac/tasknamespaces. Keep them to what the code
// calls: a verb added here is a verb every cluster running the executor grants it.

// Secrets of the executor's own (plugins' SecretManager), in its own namespace only: a
// namespaced Role (the deployment's namespace replaces "flyte"). No Secret of a task
// namespace is readable: the kubelet delivers an action's secrets to its pod.
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get,namespace=flyte

// PodTemplates a platform team keeps in the executor's namespace, for every tenant's
// actions to name (labelled flyte.org/pod-template=true; the informer reads no others).
// +kubebuilder:rbac:groups="",resources=podtemplates,verbs=list;watch,namespace=flyte

// Leader election, in the executor's own namespace only (leaderElectionNamespace must
// stay there).
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;create;update,namespace=flyte

// The secure metrics endpoint authenticates scrapers and authorises them by RBAC.
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create

// Namespaces' labels name the project each namespace's actions may name (package
// tenancy): read from a metadata-only informer, so names and labels alone.
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get;list;watch
