package config

import (
	"crypto/x509"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"os"
	"reflect"
	"slices"
	"strings"
	"text/template"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/flytekube/backend/executor/datastore/prefix"
	"github.com/flytekube/backend/executor/pluginmachinery/k8s"
)

// podSpecFields are the JSON names of a PodSpec's fields, those an inline pod template
// may be allowed to set.
var podSpecFields = func() map[string]bool {
	out := map[string]bool{}
	t := reflect.TypeFor[corev1.PodSpec]()
	for i := range t.NumField() {
		if name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ","); name != "" && name != "-" {
			out[name] = true
		}
	}
	return out
}()

// sampleLogLinkData is what a log link template is tried with.
var sampleLogLinkData = k8s.LogLinkData{Namespace: "demo", PodName: "r1-a0-1", ContainerName: "task",
	Project: "demo", Domain: "development", Run: "r1", Action: "a0", Attempt: 1}

// Validate reports every problem with c rather than just the first, so that one edit can
// fix them all; each names its field by YAML path. It returns nil if c is usable.
func (c Config) Validate() error {
	var errs []error
	fail := func(path, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", path, fmt.Sprintf(format, args...)))
	}

	// A directory alone cannot be loaded; controller-runtime joins the file names onto it.
	if c.MetricsCertPath != "" {
		if c.MetricsCertName == "" {
			fail("metricsCertName", "must be set when metricsCertPath is set")
		}
		if c.MetricsCertKey == "" {
			fail("metricsCertKey", "must be set when metricsCertPath is set")
		}
	}
	seen := map[string]bool{}
	for i, ns := range c.Namespaces {
		if msgs := validation.IsDNS1123Label(ns); len(msgs) > 0 {
			fail(fmt.Sprintf("namespaces[%d]", i), "%q is not a namespace name: %s", ns, strings.Join(msgs, "; "))
		} else if seen[ns] {
			fail(fmt.Sprintf("namespaces[%d]", i), "%q is listed twice", ns)
		}
		seen[ns] = true
	}
	if c.ExecutorNamespace != "" {
		if msgs := validation.IsDNS1123Label(c.ExecutorNamespace); len(msgs) > 0 {
			fail("executorNamespace", "%q is not a namespace name: %s", c.ExecutorNamespace, strings.Join(msgs, "; "))
		}
	}
	if c.LeaderElect && c.LeaderElectionID == "" {
		fail("leaderElectionID", "must be set when leaderElect is true")
	}

	// Checked here because a bad URL would otherwise show up only as failed requests,
	// one per action, long after start-up.
	if err := checkServiceURL(c.EventsServiceURL); err != nil {
		fail("eventsServiceURL", "%v", err)
	}
	if err := checkServiceURL(c.CacheServiceURL); err != nil {
		fail("cacheServiceURL", "%v", err)
	}

	// The credentials are checked now, not at the first call of a service, which would
	// fail for every action alike.
	if c.ServiceTokenFile != "" {
		if err := checkTokenFile(c.ServiceTokenFile); err != nil {
			fail("serviceTokenFile", "%v", err)
		}
	}
	if c.ServiceCAFile != "" {
		if err := checkCAFile(c.ServiceCAFile); err != nil {
			fail("serviceCAFile", "%v", err)
		}
		// A CA bundle trusted for plain http would protect nothing: say so rather than
		// send the token in the clear to a service thought to be verified.
		for _, s := range []struct{ field, url string }{{"eventsServiceURL", c.EventsServiceURL}, {"cacheServiceURL", c.CacheServiceURL}} {
			if strings.HasPrefix(s.url, "http://") {
				fail(s.field, "must be an https URL when serviceCAFile is set, got %q", s.url)
			}
		}
	}
	seen, onDisk := map[string]bool{}, false
	for i, raw := range c.Storage.AllowedPrefixes {
		path := fmt.Sprintf("storage.allowedPrefixes[%d]", i)
		p, err := prefix.Parse(raw)
		switch {
		case err != nil:
			fail(path, "%v", err)
		case seen[p.String()]:
			fail(path, "%s is listed twice", p)
		}
		seen[p.String()] = true
		onDisk = onDisk || err == nil && p.Scheme() == "file"
	}
	if err := c.Tenancy.Rule().Validate(); err != nil {
		fail("tenancy", "%v", err)
	}
	st := c.Storage
	for _, q := range []struct {
		path     string
		value    int64
		min, max int64
	}{
		// A document is held in memory whole, by every worker at once at worst.
		{"storage.maxDocumentBytes", st.MaxDocumentBytes.Value(), 1 << 10, 256 << 20},
		{"storage.maxCopyBytes", st.MaxCopyBytes.Value(), 1 << 10, 1 << 40},
		{"storage.maxOutputEntries", int64(st.MaxOutputEntries), 1, 10_000_000},
		// Each level is a directory held open and a frame of the walk.
		{"storage.maxOutputDepth", int64(st.MaxOutputDepth), 1, 1024},
	} {
		if q.value < q.min || q.value > q.max {
			fail(q.path, "must be from %d to %d, got %d", q.min, q.max, q.value)
		}
	}
	if st.CallTimeout.Duration <= 0 {
		fail("storage.callTimeout", "must be positive, got %s", st.CallTimeout.Duration)
	}
	if st.CopyTimeout.Duration < st.CallTimeout.Duration {
		fail("storage.copyTimeout", "must be at least storage.callTimeout (%s), got %s", st.CallTimeout.Duration, st.CopyTimeout.Duration)
	}
	if c.K8s.MountFileStorage && !onDisk {
		// Without one, every action's file:// data is refused, so nothing would be mounted.
		fail("k8s.mountFileStorage", "needs a file:// prefix in storage.allowedPrefixes")
	}

	switch {
	case c.MaxSystemFailures < 0:
		fail("maxSystemFailures", "must not be negative, got %d", c.MaxSystemFailures)
	case c.MaxSystemFailures > MaxSystemFailuresLimit:
		// The events contract bounds attempt numbers by what the executor can make:
		// 1 + 10 retries + 100 system failures.
		fail("maxSystemFailures", "at most %d, got %d", MaxSystemFailuresLimit, c.MaxSystemFailures)
	default:
		// A threshold no action reaches before its system budget runs out would never
		// move one to on-demand capacity: surely not what was meant.
		switch m, t := c.MaxSystemFailures, c.K8s.InterruptibleFailureThreshold; {
		case t > m:
			fail("k8s.interruptibleFailureThreshold", "must not exceed maxSystemFailures (%d), got %d: no attempt runs after more system failures than that", m, t)
		case t < -m:
			fail("k8s.interruptibleFailureThreshold", "must not be below -maxSystemFailures (%d), got %d: a negative threshold counts back from maxSystemFailures", -m, t)
		}
	}
	if c.MaxConcurrentReconciles < 1 {
		fail("maxConcurrentReconciles", "must be at least 1, got %d", c.MaxConcurrentReconciles)
	}

	base, maxDelay := c.RetryBackoff.Base.Duration, c.RetryBackoff.Cap.Duration
	if base <= 0 {
		fail("retryBackoff.base", "must be positive, got %s", base)
	}
	if maxDelay < base {
		fail("retryBackoff.cap", "must be at least retryBackoff.base (%s), got %s", base, maxDelay)
	}

	interval, ttl := c.GC.Interval.Duration, c.GC.MaxTTL.Duration
	if interval < 0 {
		fail("gc.interval", "must not be negative (0 disables garbage collection), got %s", interval)
	}
	switch {
	case ttl < 0:
		fail("gc.maxTTL", "must not be negative, got %s", ttl)
	case ttl == 0 && interval > 0:
		// A zero TTL would delete actions the moment they finish, before anyone can read
		// their outcome.
		fail("gc.maxTTL", "must be positive when gc.interval is set")
	}
	for _, bound := range []struct {
		name  string
		value float64
	}{{"gc.maxFinished", float64(c.GC.MaxFinished)}, {"gc.maxFinishedPerNamespace", float64(c.GC.MaxFinishedPerNamespace)},
		{"gc.deletesPerSecond", c.GC.DeletesPerSecond}} {
		if bound.value < 0 {
			fail(bound.name, "must not be negative (0 is no bound), got %v", bound.value)
		}
	}
	// Without a bound an events outage fills etcd, which then refuses every write of the
	// cluster: 0 is refused rather than read as "none".
	if n := c.EventsBacklog.MaxUndeliveredFinished; n < 1 {
		fail("eventsBacklog.maxUndeliveredFinished", "must be at least 1 (there is no unbounded setting), got %d", n)
	}

	if n := c.EventsDelivery.MaxRefusals; n < 0 {
		fail("eventsDelivery.maxRefusals", "must not be negative (0 never gives events up), got %d", n)
	}

	// An action's phase keeps at most 8 links, and the events service refuses a link
	// whose name is empty or long, or whose URI is not absolute: such a link would hold
	// the action's events back.
	if len(c.LogLinks) > 8 {
		fail("logLinks", "at most 8, got %d", len(c.LogLinks))
	}
	for i, l := range c.LogLinks {
		path := fmt.Sprintf("logLinks[%d]", i)
		if strings.TrimSpace(l.Name) == "" || len(l.Name) > 128 {
			fail(path+".name", "must be 1 to 128 characters")
		}
		t, err := template.New(l.Name).Option("missingkey=error").Parse(l.URITemplate)
		if err != nil || strings.TrimSpace(l.URITemplate) == "" {
			fail(path+".uriTemplate", "must be a Go template of a URI: %v", err)
			continue
		}
		var b strings.Builder
		if err := t.Execute(&b, sampleLogLinkData); err != nil {
			fail(path+".uriTemplate", "does not render: %v", err)
		} else if u, err := url.Parse(b.String()); err != nil || !u.IsAbs() || strings.ContainsAny(b.String(), " \t\n") {
			fail(path+".uriTemplate", "must render an absolute URI, such as https://logs.example.com/...; got %q", b.String())
		}
	}
	switch c.CacheSharing {
	case "", CacheShared:
	case CachePerCluster:
		if c.Cluster == "" {
			fail("cacheSharing", "%q needs cluster set: the entries are kept apart by it", CachePerCluster)
		}
	default:
		fail("cacheSharing", "want %q or %q, got %q", CacheShared, CachePerCluster, c.CacheSharing)
	}
	if len(c.Cluster) > 253 {
		fail("cluster", "at most 253 characters, got %d", len(c.Cluster))
	}
	for _, taskType := range slices.Sorted(maps.Keys(c.DefaultForTaskTypes)) {
		path := fmt.Sprintf("defaultForTaskTypes[%q]", taskType)
		if strings.TrimSpace(taskType) == "" {
			fail(path, "task type must not be empty")
		}
		if strings.TrimSpace(c.DefaultForTaskTypes[taskType]) == "" {
			fail(path, "plugin ID must not be empty")
		}
	}

	for _, namespace := range slices.Sorted(maps.Keys(c.QueueWeights)) {
		path := fmt.Sprintf("queueWeights[%q]", namespace)
		if errs := validation.IsDNS1123Label(namespace); len(errs) > 0 {
			fail(path, "not a namespace name: %s", strings.Join(errs, "; "))
		}
		if w := c.QueueWeights[namespace]; w < 1 || w > MaxQueueWeight {
			fail(path, "must be from 1 to %d, got %d", MaxQueueWeight, w)
		}
	}

	k := c.K8s
	if k.DefaultCPURequest.Sign() < 0 {
		fail("k8s.defaultCpuRequest", "must not be negative, got %s", k.DefaultCPURequest.String())
	}
	if k.DefaultMemoryRequest.Sign() < 0 {
		fail("k8s.defaultMemoryRequest", "must not be negative, got %s", k.DefaultMemoryRequest.String())
	}
	if k.ImagePullGracePeriod.Duration < 0 {
		fail("k8s.imagePullGracePeriod", "must not be negative, got %s", k.ImagePullGracePeriod.Duration)
	}
	if k.MissingSecretGracePeriod.Duration < 0 {
		fail("k8s.missingSecretGracePeriod", "must not be negative, got %s", k.MissingSecretGracePeriod.Duration)
	}
	if _, err := k8s.CompileDeviceFaults(k.DeviceFaults); err != nil {
		errs = append(errs, err)
	}
	if k.DeviceFaults.LateEventWait.Duration < 0 {
		fail("k8s.deviceFaults.lateEventWait", "must not be negative, got %s", k.DeviceFaults.LateEventWait.Duration)
	}
	// Checked here because a bad label would otherwise fail every create, one action at
	// a time.
	checkLabels := func(path string, m map[string]string, values bool) {
		for _, key := range slices.Sorted(maps.Keys(m)) {
			if problems := validation.IsQualifiedName(key); len(problems) > 0 {
				fail(fmt.Sprintf("%s[%q]", path, key), "not a valid key: %s", strings.Join(problems, "; "))
			}
			if !values {
				continue
			}
			if problems := validation.IsValidLabelValue(m[key]); len(problems) > 0 {
				fail(fmt.Sprintf("%s[%q]", path, key), "not a valid value: %s", strings.Join(problems, "; "))
			}
		}
	}
	checkLabels("k8s.defaultLabels", k.DefaultLabels, true)
	checkLabels("k8s.defaultAnnotations", k.DefaultAnnotations, false)
	checkLabels("k8s.interruptibleNodeSelector", k.InterruptibleNodeSelector, true)
	if n := k.DefaultPodTemplateName; n != "" {
		if problems := validation.IsDNS1123Subdomain(n); len(problems) > 0 {
			fail("k8s.defaultPodTemplateName", "not a valid name: %s", strings.Join(problems, "; "))
		}
	}
	if l := k.InlinePodTemplateLevel; l != "" && l != "baseline" && l != "privileged" { // "" is baseline
		fail("k8s.inlinePodTemplateLevel", "must be baseline or privileged, got %q", l)
	}
	// A misspelt field would otherwise refuse every fragment that sets the field meant.
	for i, f := range k.InlinePodTemplateFields {
		switch {
		case !podSpecFields[f]:
			fail(fmt.Sprintf("k8s.inlinePodTemplateFields[%d]", i), "%q is not a field of a PodSpec", f)
		case slices.Index(k.InlinePodTemplateFields, f) < i:
			fail(fmt.Sprintf("k8s.inlinePodTemplateFields[%d]", i), "%q is listed twice", f)
		}
	}

	return errors.Join(errs...)
}

// checkTokenFile makes sure a token can be read from path.
func checkTokenFile(path string) error {
	token, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if strings.TrimSpace(string(token)) == "" {
		return fmt.Errorf("%s is empty", path)
	}
	return nil
}

// checkCAFile makes sure path holds at least one PEM certificate.
func checkCAFile(path string) error {
	bundle, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if !x509.NewCertPool().AppendCertsFromPEM(bundle) {
		return fmt.Errorf("%s holds no PEM certificate", path)
	}
	return nil
}

// checkServiceURL accepts an empty URL, which disables the integration, or an absolute
// http or https URL.
func checkServiceURL(raw string) error {
	if raw == "" {
		return nil
	}
	u, err := url.Parse(raw)
	if err != nil {
		return err
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("must be an http or https URL, or empty to disable, got %q", raw)
	}
	if u.Host == "" {
		return fmt.Errorf("must include a host, got %q", raw)
	}
	return nil
}

// MaxSystemFailuresLimit is the most system failures an action may be allowed; with the
// CRD's 10 retries it keeps attempt numbers within the events contract's 111.
const MaxSystemFailuresLimit = 100
