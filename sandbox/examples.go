package sandbox

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/yaml"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
)

// Annotations on the examples say how each should end, so the sandbox can tell whether
// the system did what it should.
const (
	annotationExpect         = "examples.flyte.org/expect"          // a terminal phase, or "Rejected"
	annotationExpectCache    = "examples.flyte.org/expect-cache"    // a cache status
	annotationExpectAttempts = "examples.flyte.org/expect-attempts" // a number of attempts
	annotationExpectOutputs  = "examples.flyte.org/expect-outputs"  // "true": it wrote outputs
	// annotationAfter holds an example back until the one it names has ended.
	annotationAfter = "examples.flyte.org/after"
	// annotationNeedsNode marks an example that runs pods: without a node it is left out.
	annotationNeedsNode = "examples.flyte.org/needs-node"
	// annotationCluster "second" runs an example in the second cluster (make run
	// CLUSTERS=2); without one it is left out.
	annotationCluster = "examples.flyte.org/cluster"
	expectRejected    = "Rejected"
)

// example is one TaskAction from the examples directory and what became of it.
type example struct {
	file   string
	action *flytev1.TaskAction
	// rejected is the API server's refusal, if it refused it.
	rejected error
	// applied is set once the example was sent to the API server.
	applied bool
	// templates are the PodTemplates its file holds before it, made before it is applied.
	templates []*corev1.PodTemplate
	// client applies it to the second cluster (annotationCluster); nil to the first.
	client client.Client
}

// loadExamples reads every TaskAction in the *.yaml files of dir, in file order, each
// with the PodTemplates its file holds before it.
func loadExamples(dir string) ([]*example, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return nil, err
	}
	slices.Sort(files)
	var out []*example
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("sandbox: %w", err)
		}
		docs := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(raw)))
		var templates []*corev1.PodTemplate
		for i := 1; ; i++ {
			doc, err := docs.Read()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return nil, fmt.Errorf("sandbox: %s, document %d: %w", f, i, err)
			}
			if asJSON, err := yaml.YAMLToJSON(doc); err == nil && string(asJSON) == "null" {
				continue // only comments
			}
			var kind metav1.TypeMeta
			if err := yaml.Unmarshal(doc, &kind); err == nil && kind.Kind == "PodTemplate" {
				var t corev1.PodTemplate
				if err := yaml.UnmarshalStrict(doc, &t); err != nil {
					return nil, fmt.Errorf("sandbox: %s, document %d: %w", f, i, err)
				}
				templates = append(templates, &t)
				continue
			}
			var ta flytev1.TaskAction
			if err := yaml.UnmarshalStrict(doc, &ta); err != nil { // strict: a misspelt field is an error
				return nil, fmt.Errorf("sandbox: %s, document %d: %w", f, i, err)
			}
			out = append(out, &example{file: filepath.Base(f), action: &ta, templates: templates})
			templates = nil
		}
		if len(templates) > 0 {
			return nil, fmt.Errorf("sandbox: %s: a PodTemplate with no TaskAction after it", f)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("sandbox: no TaskActions in %s", dir)
	}
	return out, nil
}

// The Secret examples/08-secret.yaml reads, which the sandbox makes in the examples'
// namespace before applying them.
const (
	exampleSecretName = "db"
	exampleSecretKey  = "password"
)

// makeExampleSecret creates (or, in a cluster kept from an earlier run, overwrites) the
// Secret the examples read, with a value made at random for this run: nobody should come
// to rely on a development password, and a value that appears nowhere else lets a test
// find it wherever it leaked.
func makeExampleSecret(ctx context.Context, c client.Client) (string, error) {
	random := make([]byte, 16)
	if _, err := rand.Read(random); err != nil {
		return "", fmt.Errorf("sandbox: %w", err)
	}
	value := "sandbox-db-password-" + hex.EncodeToString(random)
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: exampleSecretName, Namespace: demoNamespace}}
	if _, err := controllerutil.CreateOrUpdate(ctx, c, secret, func() error {
		secret.Type = corev1.SecretTypeOpaque
		secret.Data = map[string][]byte{exampleSecretKey: []byte(value)}
		return nil
	}); err != nil {
		return "", fmt.Errorf("sandbox: making the Secret %s/%s: %w", demoNamespace, exampleSecretName, err)
	}
	return value, nil
}

// withoutPods drops the examples that need a node to run their pods, and names them.
func withoutPods(examples []*example) (kept []*example, left []string) {
	return without(examples, annotationNeedsNode, "true")
}

// withoutSecondCluster drops the examples that run in the second cluster, and names them.
func withoutSecondCluster(examples []*example) (kept []*example, left []string) {
	return without(examples, annotationCluster, "second")
}

// without drops the examples whose annotation has value, and names them.
func without(examples []*example, annotation, value string) (kept []*example, left []string) {
	for _, e := range examples {
		if e.action.Annotations[annotation] == value {
			left = append(left, e.action.Name)
			continue
		}
		kept = append(kept, e)
	}
	return kept, left
}

// inSecondCluster makes the examples of the second cluster apply there, in its own
// namespace of the examples.
func inSecondCluster(ctx context.Context, c client.Client, examples []*example) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: demoNamespace}}
	if err := c.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("sandbox: creating namespace %s in the second cluster: %w", demoNamespace, err)
	}
	for _, e := range examples {
		if e.action.Annotations[annotationCluster] == "second" {
			e.client = c
		}
	}
	return nil
}

// apply creates the examples that are not applied yet and whose predecessor (if any)
// has ended, each in its cluster (c is the first's); a refusal is recorded, since
// showing one is the point of an invalid example.
func apply(ctx context.Context, c client.Client, examples []*example) error {
	ended := map[string]bool{}
	for _, e := range examples {
		if done, _ := e.verdict(); done && e.applied {
			ended[e.action.Name] = true
		}
	}
	for _, e := range examples {
		if e.applied {
			continue
		}
		if after := e.action.Annotations[annotationAfter]; after != "" && !ended[after] {
			continue
		}
		c := c
		if e.client != nil {
			c = e.client
		}
		for _, t := range e.templates {
			t := t.DeepCopy()
			if err := c.Create(ctx, t); err != nil && !apierrors.IsAlreadyExists(err) {
				return fmt.Errorf("sandbox: applying the PodTemplate %s from %s: %w", t.Name, e.file, err)
			}
		}
		e.applied = true
		ta := e.action.DeepCopy()
		err := c.Create(ctx, ta)
		switch {
		case err == nil:
			e.action = ta
		case e.expect() == expectRejected:
			e.rejected = err
		default:
			return fmt.Errorf("sandbox: applying %s from %s: %w", e.action.Name, e.file, err)
		}
	}
	return nil
}

func (e *example) expect() string { return e.action.Annotations[annotationExpect] }

// verdict says whether the example ended as expected: done once it cannot change any
// more, and a problem when it ended otherwise.
func (e *example) verdict() (done bool, problem string) {
	want := e.expect()
	if !e.applied {
		return false, ""
	}
	if want == expectRejected {
		if e.rejected == nil {
			return true, "was admitted; want it rejected"
		}
		return true, ""
	}
	st := e.action.Status
	if !st.Phase.IsTerminal() {
		return false, ""
	}
	switch {
	case want != "" && string(st.Phase) != want:
		return true, fmt.Sprintf("ended %s; want %s", st.Phase, want)
	case e.action.Annotations[annotationExpectCache] != "" && string(st.CacheStatus) != e.action.Annotations[annotationExpectCache]:
		return true, fmt.Sprintf("cache %s; want %s", st.CacheStatus, e.action.Annotations[annotationExpectCache])
	case e.action.Annotations[annotationExpectOutputs] == "true" && st.OutputsURI == "":
		return true, "wrote no outputs; want some"
	}
	if a := e.action.Annotations[annotationExpectAttempts]; a != "" {
		if n, _ := strconv.Atoi(a); int32(n) != st.Attempts {
			return true, fmt.Sprintf("took %d attempts; want %d", st.Attempts, n)
		}
	}
	return true, ""
}

// observe takes the state the API server reports of an admitted example. An object of
// an earlier run, deleted as this one started, has another UID and is ignored.
func observe(examples []*example, ta *flytev1.TaskAction) {
	for _, e := range examples {
		if e.applied && e.rejected == nil && e.action.UID == ta.UID {
			e.action = ta
		}
	}
}

// settled reports whether every example has ended, and how those that ended otherwise
// than expected did.
func settled(examples []*example) (bool, []string) {
	all, problems := true, []string(nil)
	for _, e := range examples {
		done, problem := e.verdict()
		all = all && done
		if problem != "" {
			problems = append(problems, e.action.Name+" "+problem)
		}
	}
	return all, problems
}
