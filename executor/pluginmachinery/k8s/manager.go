package k8s

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/fields"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/pluginmachinery/core"
	"github.com/flytekube/backend/internal/backoff"
)

// LabelTaskActionUID is core.LabelTaskActionUID, which the manager puts on every
// object it creates.
const LabelTaskActionUID = core.LabelTaskActionUID

// quotaBackoff spaces the waits for a ResourceQuota to make room: exponential,
// jittered, up to a cap, so that a namespace full of waiting actions does not hammer
// the API server.
var quotaBackoff = backoff.Backoff{Base: time.Second, Cap: 2 * time.Minute}

// nameTakenWait is how long to wait for an old object holding this attempt's name.
const nameTakenWait = 5 * time.Second

// stateVersion versions managerState.
const stateVersion = 1

// managerState is what the manager keeps between reconciles of an attempt.
type managerState struct {
	// Created is set once the attempt's object was created (or adopted): from then on,
	// an object that cannot be found is gone, not yet to be made.
	Created bool `json:"created"`
	// QuotaRefusals counts creates a ResourceQuota refused, for the backoff.
	QuotaRefusals int `json:"quotaRefusals,omitempty"`
	// Reported is the phase (and version) last reported, and Events marks the
	// Kubernetes events reported with it.
	Reported string    `json:"reported,omitempty"`
	Events   eventMark `json:"events,omitzero"`
}

// eventMark marks the Kubernetes events already reported: all up to the second Until
// and, of that second, those named in Seen. Event times are compared at whole
// seconds because their precision differs: the scheduler's EventTime has
// microseconds, the kubelet's LastTimestamp whole seconds, so a later event of the
// same second can carry an earlier time than one already reported.
type eventMark struct {
	Until time.Time `json:"until,omitzero"`
	Seen  []string  `json:"seen,omitempty"`
}

// maxSeenEvents bounds eventMark.Seen, which is kept in the action's status: past it,
// an event of an overfull second may be reported twice.
const maxSeenEvents = 2 * flytev1.MaxClusterEvents

// eventKey names an event in a mark: an event repeated (its count raised) is news again.
func eventKey(e *corev1.Event) string { return string(e.UID) + "/" + strconv.Itoa(int(e.Count)) }

// reported reports whether the event of key, of the whole second second, was reported.
func (m eventMark) reported(second time.Time, key string) bool {
	switch {
	case second.Before(m.Until):
		return true
	case second.After(m.Until):
		return false
	}
	return slices.Contains(m.Seen, key)
}

// Entry adapts a Kubernetes plugin to the core registry.
func Entry(e PluginEntry, cfg Config) core.Entry {
	return core.Entry{
		ID: e.ID, RegisteredTaskTypes: e.RegisteredTaskTypes, IsDefault: e.IsDefault, Watches: e.ResourceToWatch,
		LoadPlugin: func(_ context.Context, setup core.SetupContext) (core.Plugin, error) {
			p := e.Plugin
			if e.Load != nil {
				var err error
				if p, err = e.Load(setup); err != nil {
					return nil, fmt.Errorf("%s: loading: %w", e.ID, err)
				}
			}
			return &PluginManager{id: e.ID, plugin: p, client: setup.Client(),
				reader: setup.APIReader(), cfg: cfg}, nil
		},
	}
}

// PluginManager runs a Kubernetes plugin as a core plugin.
type PluginManager struct {
	id     string
	plugin Plugin
	client client.Client // cached reads, writes
	reader client.Reader // uncached reads, for the rare case the cache cannot answer
	cfg    Config
}

var _ core.Plugin = (*PluginManager)(nil)

// GetID implements core.Plugin.
func (m *PluginManager) GetID() string { return m.id }

// GetProperties implements core.Plugin: the objects live outside the action, so the
// action needs its finalizer before one is created.
func (m *PluginManager) GetProperties() core.Properties {
	return core.Properties{NeedsFinalizer: true}
}

func (m *PluginManager) identity(ctx context.Context, md core.TaskExecutionMetadata) (client.Object, error) {
	obj, err := m.plugin.BuildIdentityResource(ctx, md)
	if err != nil {
		return nil, fmt.Errorf("%s: building identity: %w", m.id, err)
	}
	obj.SetName(md.ObjectName())
	obj.SetNamespace(md.Action().Namespace)
	return obj, nil
}

// Handle implements core.Plugin: create the attempt's object if it does not exist yet,
// otherwise report its phase.
func (m *PluginManager) Handle(ctx context.Context, tCtx core.TaskExecutionContext) (core.Transition, error) {
	md := tCtx.Metadata()
	var st managerState
	if _, err := tCtx.PluginStateReader().Get(&st); err != nil {
		return core.Transition{}, err
	}
	obj, err := m.identity(ctx, md)
	if err != nil {
		return core.Transition{}, err
	}
	objKind := kind(obj) // a typed Get clears the type meta
	err = m.get(ctx, obj)
	switch {
	case apierrors.IsNotFound(err) && st.Created:
		return core.DoTransition(core.PhaseInfoSystemFailure("ObjectGone",
			fmt.Sprintf("%s %s disappeared before it finished", objKind, obj.GetName()))), nil
	case apierrors.IsNotFound(err):
		return m.create(ctx, tCtx, st)
	case err != nil:
		return core.Transition{}, apiError(fmt.Sprintf("%s: reading %s", m.id, obj.GetName()), err)
	}
	if !m.ours(obj, md) {
		// Someone else's object holds this attempt's name: never report it as ours. A new
		// attempt has a new name, so the action goes on there, on the system budget.
		return core.DoTransition(core.PhaseInfoSystemFailure("ObjectConflict",
			fmt.Sprintf("%s %s exists but belongs to another action or attempt", objKind, obj.GetName()))), nil
	}
	if !st.Created {
		st.Created = true
		if err := tCtx.PluginStateWriter().Put(stateVersion, st); err != nil {
			return core.Transition{}, err
		}
	}
	info, err := m.plugin.GetTaskPhase(ctx, tCtx, obj)
	if err != nil {
		return core.Transition{}, fmt.Errorf("%s: reading the phase of %s: %w", m.id, obj.GetName(), err)
	}
	events := m.eventsOnce(ctx, obj)
	if r, ok := m.plugin.(EventReader); ok {
		if info, err = r.PhaseFromEvents(ctx, tCtx, obj, info, events); err != nil {
			return core.Transition{}, fmt.Errorf("%s: reading the phase of %s from its events: %w", m.id, obj.GetName(), err)
		}
	}
	// With each change of phase, report the Kubernetes events about the object since
	// the previous change: one read per change, not per reconcile.
	if reported := reportedAs(info); reported != st.Reported {
		st.Created, st.Reported = true, reported
		info.ClusterEvents, st.Events = clusterEvents(events, st.Events)
		if err := tCtx.PluginStateWriter().Put(stateVersion, st); err != nil {
			return core.Transition{}, err
		}
	}
	return core.DoTransition(info), nil
}

// eventsOnce returns a function that lists the events about obj, oldest first, reading
// them from the API server the first time it is called only.
func (m *PluginManager) eventsOnce(ctx context.Context, obj client.Object) func() ([]corev1.Event, error) {
	var (
		read   bool
		events []corev1.Event
		err    error
	)
	return func() ([]corev1.Event, error) {
		if read {
			return events, err
		}
		read = true
		if events, err = ListEvents(ctx, m.reader, obj); err != nil {
			err = apiError(fmt.Sprintf("%s: listing the events of %s", m.id, obj.GetName()), err)
		}
		return events, err
	}
}

// MaxListedEvents bounds one read of an object's events: whoever may create events in
// its namespace may write any number of them about it. Past it, the API server's first
// page, which holds the oldest (an event's name ends in its creation time), is read.
const MaxListedEvents = 1000

// ListEvents lists the Kubernetes events about obj (found by its UID, in its namespace),
// oldest first, at most MaxListedEvents of them. reader should be an uncached one, such as core.SetupContext's
// APIReader: the executor caches no events. A plugin reads the events of objects other
// than its own with it, such as the pods of a Job.
func ListEvents(ctx context.Context, reader client.Reader, obj client.Object) ([]corev1.Event, error) {
	var list corev1.EventList
	err := reader.List(ctx, &list, client.InNamespace(obj.GetNamespace()), client.Limit(MaxListedEvents),
		client.MatchingFieldsSelector{Selector: fields.OneTermEqualSelector("involvedObject.uid", string(obj.GetUID()))})
	if err != nil {
		return nil, err
	}
	events := list.Items
	slices.SortStableFunc(events, func(a, b corev1.Event) int { return eventTime(&a).Compare(eventTime(&b)) })
	return events, nil
}

// clusterEvents are the events not yet reported, the newest last, at most
// flytev1.MaxClusterEvents of them, and the mark that includes them. They are
// context for people, so a failed read reports none.
func clusterEvents(events func() ([]corev1.Event, error), mark eventMark) ([]core.ClusterEvent, eventMark) {
	list, err := events()
	if err != nil {
		return nil, mark
	}
	var out []core.ClusterEvent
	next := eventMark{Until: mark.Until, Seen: slices.Clone(mark.Seen)}
	for _, e := range list {
		at, key := eventTime(&e), eventKey(&e)
		second := at.Truncate(time.Second)
		if mark.reported(second, key) {
			continue
		}
		switch {
		case second.After(next.Until):
			next = eventMark{Until: second, Seen: []string{key}}
		case second.Equal(next.Until) && len(next.Seen) < maxSeenEvents:
			next.Seen = append(next.Seen, key)
		}
		out = append(out, core.ClusterEvent{OccurredAt: at, Object: e.InvolvedObject.Kind + "/" + e.InvolvedObject.Name,
			Type: e.Type, Reason: e.Reason, Message: e.Message, Source: eventSource(&e), Count: e.Count})
	}
	slices.SortFunc(out, func(a, b core.ClusterEvent) int { return a.OccurredAt.Compare(b.OccurredAt) })
	if len(out) > flytev1.MaxClusterEvents {
		out = out[len(out)-flytev1.MaxClusterEvents:]
	}
	return out, next
}

// eventSource is the component that reported e: its source's, or for an event written
// through events.k8s.io, which leaves the source empty, its reporting controller.
func eventSource(e *corev1.Event) string {
	if e.Source.Component != "" {
		return e.Source.Component
	}
	return e.ReportingController
}

func eventTime(e *corev1.Event) time.Time {
	switch {
	case !e.LastTimestamp.IsZero():
		return e.LastTimestamp.Time
	case !e.EventTime.IsZero():
		return e.EventTime.Time
	case !e.FirstTimestamp.IsZero():
		return e.FirstTimestamp.Time
	}
	return e.CreationTimestamp.Time
}

// ours reports whether obj was made for this action and attempt.
func (m *PluginManager) ours(obj client.Object, md core.TaskExecutionMetadata) bool {
	l := obj.GetLabels()
	return l[LabelTaskActionUID] == string(md.Action().UID) && l[core.LabelAttempt] == md.Labels()[core.LabelAttempt]
}

func (m *PluginManager) create(ctx context.Context, tCtx core.TaskExecutionContext, st managerState) (core.Transition, error) {
	md := tCtx.Metadata()
	obj, err := m.plugin.BuildResource(ctx, tCtx)
	if core.IsTransient(err) {
		return core.Transition{}, err
	}
	if err != nil {
		code := CodeBadTaskSpec
		var bad *badSpecError
		if errors.As(err, &bad) {
			code = bad.code
		}
		return core.DoTransition(core.PhaseInfoPermanentFailure(core.ErrorKindUser, code, err.Error())), nil
	}
	m.decorate(obj, md)
	err = m.client.Create(ctx, obj)
	switch {
	case err == nil:
	case apierrors.IsAlreadyExists(err):
		// Created by an earlier pass whose result we did not see (a crash, a conflict):
		// adopt it only if it is this attempt's and alive; never report someone else's.
		existing, ierr := m.identity(ctx, md)
		if ierr != nil {
			return core.Transition{}, ierr
		}
		existingKind := kind(existing)
		if gerr := m.reader.Get(ctx, client.ObjectKeyFromObject(existing), existing); gerr != nil {
			return core.Transition{}, apiError(fmt.Sprintf("%s: reading existing %s", m.id, existing.GetName()), gerr)
		}
		if !m.ours(existing, md) || existing.GetDeletionTimestamp() != nil {
			info := core.PhaseInfoWaitingForResources(0, "ObjectNameTaken",
				fmt.Sprintf("%s %s exists and is not this attempt's; waiting for it to go", existingKind, existing.GetName()))
			info.RequeueAfter = nameTakenWait
			return core.DoTransition(info), nil
		}
	case isQuotaExceeded(err):
		if over := overHardLimit(err.Error()); over != "" {
			// Waiting cannot help: even an empty namespace would not fit it.
			return core.DoTransition(core.PhaseInfoPermanentFailure(core.ErrorKindUser, "ExceedsResourceQuota",
				fmt.Sprintf("the %s requested is more than the namespace's quota allows at all: %s", over, err.Error()))), nil
		}
		st.QuotaRefusals++
		if err := tCtx.PluginStateWriter().Put(stateVersion, st); err != nil {
			return core.Transition{}, err
		}
		info := core.PhaseInfoWaitingForResources(uint32(st.QuotaRefusals), "ResourceQuotaExceeded", err.Error())
		info.RequeueAfter = quotaBackoff.Delay(int32(min(st.QuotaRefusals, 64)))
		return core.DoTransition(info), nil
	case apierrors.IsInvalid(err):
		// The object built from the spec is not valid Kubernetes: retrying cannot help.
		return core.DoTransition(core.PhaseInfoPermanentFailure(core.ErrorKindUser, "InvalidObject",
			fmt.Sprintf("the API server refused %s %s: %v", kind(obj), obj.GetName(), err))), nil
	default:
		// Transient errors (throttling, 5xx, a lost reply) are retried after a backoff;
		// the next pass asks the API server whether a lost create went through.
		return core.Transition{}, apiError(fmt.Sprintf("%s: creating %s", m.id, obj.GetName()), err)
	}
	// Reported as Queued already: while the object waits to be scheduled, the next
	// passes report the same, and change nothing.
	info := core.PhaseInfoQueued(ReasonObjectCreated)
	if err := tCtx.PluginStateWriter().Put(stateVersion, managerState{Created: true, Reported: reportedAs(info)}); err != nil {
		return core.Transition{}, err
	}
	return core.DoTransition(info), nil
}

// CodeBadTaskSpec is the error code of an action whose object cannot be built, unless
// the plugin names another with BadSpec.
const CodeBadTaskSpec = "BadTaskSpec"

// badSpecError is a BuildResource error with its own code.
type badSpecError struct {
	code string
	err  error
}

func (e *badSpecError) Error() string { return e.err.Error() }
func (e *badSpecError) Unwrap() error { return e.err }

// BadSpec marks err, returned by BuildResource, as the action's user error code: the
// action fails at once with it, rather than with BadTaskSpec.
func BadSpec(code string, err error) error { return &badSpecError{code: code, err: err} }

// reportedAs is how managerState.Reported names a reported phase.
func reportedAs(info core.PhaseInfo) string { return fmt.Sprintf("%s/%d", info.Phase, info.Version) }

// ReasonObjectCreated is the reason of the Queued phase an attempt enters when its
// object is created; a plugin reports it again while the object waits to be scheduled.
const ReasonObjectCreated = "ObjectCreated"

func isQuotaExceeded(err error) bool {
	return apierrors.IsForbidden(err) && strings.Contains(err.Error(), "exceeded quota")
}

// overHardLimit reads the API server's quota message ("exceeded quota: q, requested:
// cpu=2, used: cpu=0, limited: cpu=1") and names a resource whose request alone is over
// the quota's hard limit, or returns "".
func overHardLimit(msg string) string {
	requested, limited := quotaList(msg, "requested: "), quotaList(msg, "limited: ")
	for name, want := range requested {
		if limit, ok := limited[name]; ok && want.Cmp(limit) > 0 {
			return name
		}
	}
	return ""
}

// quotaList parses "name=quantity,name=quantity" after prefix, up to the next ", x:".
func quotaList(msg, prefix string) map[string]resource.Quantity {
	i := strings.Index(msg, prefix)
	if i < 0 {
		return nil
	}
	rest := msg[i+len(prefix):]
	if j := strings.Index(rest, ", "); j >= 0 && strings.Contains(rest[j:], ":") {
		rest = rest[:j]
	}
	out := map[string]resource.Quantity{}
	for _, item := range strings.Split(rest, ",") {
		name, value, ok := strings.Cut(strings.TrimSpace(item), "=")
		if !ok {
			continue
		}
		if q, err := resource.ParseQuantity(strings.TrimSpace(value)); err == nil {
			out[name] = q
		}
	}
	return out
}

// decorate applies what every object gets: name, labels, annotations, owner, finalizer,
// and for pods the cluster's defaults.
func (m *PluginManager) decorate(obj client.Object, md core.TaskExecutionMetadata) {
	obj.SetName(md.ObjectName())
	obj.SetNamespace(md.Action().Namespace)
	labels := maps.Clone(m.cfg.DefaultLabels)
	if labels == nil {
		labels = map[string]string{}
	}
	maps.Copy(labels, obj.GetLabels())
	maps.Copy(labels, md.Labels())
	labels[LabelTaskActionUID] = string(md.Action().UID)
	obj.SetLabels(labels)
	if len(m.cfg.DefaultAnnotations) > 0 {
		annotations := maps.Clone(m.cfg.DefaultAnnotations)
		maps.Copy(annotations, obj.GetAnnotations())
		obj.SetAnnotations(annotations)
	}
	if !m.plugin.GetProperties().DisableInjectOwnerReferences {
		obj.SetOwnerReferences(append(obj.GetOwnerReferences(), md.OwnerReference()))
	}
	if m.cfg.InjectFinalizer {
		controllerutil.AddFinalizer(obj, Finalizer)
	}
	switch o := obj.(type) {
	case *corev1.Pod:
		m.podDefaults(&o.Spec, md)
	case *batchv1.Job:
		m.podDefaults(&o.Spec.Template.Spec, md)
	}
}

// podDefaults applies the cluster's defaults to the pods an object runs.
func (m *PluginManager) podDefaults(spec *corev1.PodSpec, md core.TaskExecutionMetadata) {
	for i := range spec.Containers {
		c := &spec.Containers[i]
		if c.Resources.Requests == nil {
			c.Resources.Requests = corev1.ResourceList{}
		}
		for name, request := range map[corev1.ResourceName]resource.Quantity{
			corev1.ResourceCPU: m.cfg.DefaultCPURequest, corev1.ResourceMemory: m.cfg.DefaultMemoryRequest,
		} {
			// A limit without a request is the request too (Kubernetes' own defaulting): a
			// default above it would make the pod invalid.
			_, requested := c.Resources.Requests[name]
			_, limited := c.Resources.Limits[name]
			if !requested && !limited && !request.IsZero() {
				c.Resources.Requests[name] = request
			}
		}
	}
	// Not the spec alone: past k8s.interruptibleFailureThreshold an interruptible
	// action's attempts run on on-demand capacity.
	if md.IsInterruptible() {
		spec.Tolerations = append(spec.Tolerations, m.cfg.InterruptibleTolerations...)
		if len(m.cfg.InterruptibleNodeSelector) > 0 {
			if spec.NodeSelector == nil {
				spec.NodeSelector = map[string]string{}
			}
			maps.Copy(spec.NodeSelector, m.cfg.InterruptibleNodeSelector)
		}
	}
}

// get reads obj from the informer cache and, when the cache does not have it, from the
// API server itself: the informer may not have seen it yet. Concluding from the cache
// alone that an object is gone would relaunch an attempt that runs, or leave a pod behind
// an abort; creating it again would fail, but the quota admission would already have
// charged the create.
func (m *PluginManager) get(ctx context.Context, obj client.Object) error {
	err := m.client.Get(ctx, client.ObjectKeyFromObject(obj), obj)
	if apierrors.IsNotFound(err) {
		err = m.reader.Get(ctx, client.ObjectKeyFromObject(obj), obj)
	}
	return err
}

// attemptObject returns the attempt's object if it exists and is this attempt's; an
// object of someone else under the same name is never touched.
func (m *PluginManager) attemptObject(ctx context.Context, md core.TaskExecutionMetadata) (client.Object, error) {
	obj, err := m.identity(ctx, md)
	if err != nil {
		return nil, err
	}
	if err := m.get(ctx, obj); err != nil {
		if err = client.IgnoreNotFound(err); err != nil {
			return nil, apiError(fmt.Sprintf("%s: reading %s", m.id, obj.GetName()), err)
		}
		return nil, nil
	}
	if !m.ours(obj, md) {
		return nil, nil
	}
	return obj, nil
}

// Abort implements core.Plugin: delete the attempt's object.
func (m *PluginManager) Abort(ctx context.Context, tCtx core.TaskExecutionContext) error {
	obj, err := m.attemptObject(ctx, tCtx.Metadata())
	if err != nil || obj == nil {
		return err
	}
	uid := obj.GetUID()
	err = m.client.Delete(ctx, obj, client.PropagationPolicy("Background"), client.Preconditions{UID: &uid})
	if client.IgnoreNotFound(err) != nil {
		return apiError(fmt.Sprintf("%s: deleting %s", m.id, obj.GetName()), err)
	}
	return nil
}

// Finalize implements core.Plugin: drop the object's finalizer, and delete it when so
// configured.
func (m *PluginManager) Finalize(ctx context.Context, tCtx core.TaskExecutionContext) error {
	obj, err := m.attemptObject(ctx, tCtx.Metadata())
	if err != nil {
		return err
	}
	if obj != nil {
		if err := m.finalizeObject(ctx, obj); err != nil {
			return err
		}
	}
	if f, ok := m.plugin.(AttemptFinalizer); ok {
		if err := f.FinalizeAttempt(ctx, tCtx); err != nil {
			return fmt.Errorf("%s: %w", m.id, err)
		}
	}
	return nil
}

// finalizeObject drops the attempt's object's finalizer, and deletes it when so
// configured.
func (m *PluginManager) finalizeObject(ctx context.Context, obj client.Object) error {
	if controllerutil.ContainsFinalizer(obj, Finalizer) {
		patch := client.MergeFromWithOptions(obj.DeepCopyObject().(client.Object), client.MergeFromWithOptimisticLock{})
		controllerutil.RemoveFinalizer(obj, Finalizer)
		if err := m.client.Patch(ctx, obj, patch); client.IgnoreNotFound(err) != nil {
			return apiError(fmt.Sprintf("%s: removing the finalizer of %s", m.id, obj.GetName()), err)
		}
	}
	// An object without an owner reference is not deleted with its action by
	// Kubernetes, so it goes when its attempt is over.
	if m.cfg.DeleteOnFinalize || m.plugin.GetProperties().DisableInjectOwnerReferences {
		uid := obj.GetUID()
		err := m.client.Delete(ctx, obj, client.PropagationPolicy("Background"), client.Preconditions{UID: &uid})
		if client.IgnoreNotFound(err) != nil {
			return apiError(fmt.Sprintf("%s: deleting %s", m.id, obj.GetName()), err)
		}
	}
	return nil
}

func kind(obj client.Object) string {
	if k := obj.GetObjectKind().GroupVersionKind().Kind; k != "" {
		return k
	}
	return fmt.Sprintf("%T", obj)
}
