// Package tasknamespaces holds, as +kubebuilder:rbac markers, what the executor may do in
// each namespace whose actions it runs. `make crd-generate` writes them to the
// ClusterRole flyte-executor-tasks (deploy/kustomize/base/rbac/tasks/role.yaml), which is
// granted by a RoleBinding in each namespace of the configuration's namespaces (or by a
// ClusterRoleBinding when it manages every namespace). What the executor needs outside
// those namespaces is in package executor (rbac.go). It holds no code.
//
// Keep the markers to what the code calls. Secrets are not here: an action's secrets are
// delivered to its pod by the kubelet, and the executor never reads them.
package tasknamespaces

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

// PodTemplates labelled flyte.org/pod-template=true, which shape task pods: read from a
// label-filtered informer.
// +kubebuilder:rbac:groups="",resources=podtemplates,verbs=list;watch

// Events: recorded on actions (core/v1, through GetEventRecorderFor), and the events
// about an attempt's pod listed by field selector.
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch;list
