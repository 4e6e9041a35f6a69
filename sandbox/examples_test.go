package sandbox

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
)

// TestVerdict: an example is judged against every expectation its annotations state.
func TestVerdict(t *testing.T) {
	tests := []struct {
		name        string
		annotations map[string]string
		status      flytev1.TaskActionStatus
		wantDone    bool
		wantProblem bool
	}{
		{"running", map[string]string{annotationExpect: "Succeeded"}, flytev1.TaskActionStatus{Phase: flytev1.PhaseRunning}, false, false},
		{"as expected", map[string]string{annotationExpect: "Succeeded"}, flytev1.TaskActionStatus{Phase: flytev1.PhaseSucceeded}, true, false},
		{"other phase", map[string]string{annotationExpect: "Succeeded"}, flytev1.TaskActionStatus{Phase: flytev1.PhaseFailed}, true, true},
		{"attempts", map[string]string{annotationExpectAttempts: "2"}, flytev1.TaskActionStatus{Phase: flytev1.PhaseSucceeded, Attempts: 1}, true, true},
		{"cache", map[string]string{annotationExpectCache: "CacheHit"}, flytev1.TaskActionStatus{Phase: flytev1.PhaseSucceeded, CacheStatus: "CacheMiss"}, true, true},
		{"outputs missing", map[string]string{annotationExpectOutputs: "true"}, flytev1.TaskActionStatus{Phase: flytev1.PhaseSucceeded}, true, true},
		{"outputs written", map[string]string{annotationExpectOutputs: "true"}, flytev1.TaskActionStatus{Phase: flytev1.PhaseSucceeded, OutputsURI: "file:///o/outputs.json"}, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := &example{applied: true, action: &flytev1.TaskAction{ObjectMeta: metav1.ObjectMeta{Annotations: tt.annotations}, Status: tt.status}}
			done, problem := e.verdict()
			if done != tt.wantDone || (problem != "") != tt.wantProblem {
				t.Fatalf("done %v, problem %q; want done %v, a problem %v", done, problem, tt.wantDone, tt.wantProblem)
			}
		})
	}
}

// TestLoadExamples: every document of every file is an example, in file order; a
// document of comments only is none; a misspelt field is an error, not a silent default.
func TestLoadExamples(t *testing.T) {
	const action = "apiVersion: flyte.org/v1\nkind: TaskAction\nmetadata: {name: %s, namespace: demo}\nspec: {taskType: core-sleep}\n"
	const podTemplateDoc = "apiVersion: v1\nkind: PodTemplate\nmetadata: {name: t, namespace: demo}\ntemplate: {spec: {containers: [{name: default, image: x}]}}\n"
	tests := []struct {
		name    string
		files   map[string]string
		want    []string
		wantErr string
	}{
		{"one per file, in file order", map[string]string{"b.yaml": fmt.Sprintf(action, "b"), "a.yaml": fmt.Sprintf(action, "a")}, []string{"a", "b"}, ""},
		{"several in a file", map[string]string{"a.yaml": "# two\n" + fmt.Sprintf(action, "a1") + "---\n" + fmt.Sprintf(action, "a2")}, []string{"a1", "a2"}, ""},
		{"comments only", map[string]string{"a.yaml": fmt.Sprintf(action, "a") + "--- # the end\n# nothing more\n"}, []string{"a"}, ""},
		{"a misspelt field", map[string]string{"a.yaml": fmt.Sprintf(action, "a") + "---\n" + strings.Replace(fmt.Sprintf(action, "b"), "taskType", "taskTipe", 1)}, nil, "a.yaml, document 2"},
		{"nothing", map[string]string{"a.yaml": "# nothing\n"}, nil, "no TaskActions"},
		{"a pod template before its action", map[string]string{"a.yaml": podTemplateDoc + "---\n" + fmt.Sprintf(action, "a")}, []string{"a"}, ""},
		{"a pod template alone", map[string]string{"a.yaml": fmt.Sprintf(action, "a") + "---\n" + podTemplateDoc}, nil, "a PodTemplate with no TaskAction after it"},
		{"a misspelt pod template", map[string]string{"a.yaml": strings.Replace(podTemplateDoc, "template:", "templat:", 1) + "---\n" + fmt.Sprintf(action, "a")}, nil, "a.yaml, document 1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			for name, content := range tt.files {
				if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			got, err := loadExamples(dir)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v; want one naming %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, e := range got {
				names = append(names, e.action.Name)
			}
			if !slices.Equal(names, tt.want) {
				t.Fatalf("examples %v; want %v", names, tt.want)
			}
		})
	}
}
