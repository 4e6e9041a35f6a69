package sandbox_test

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flytekube/backend/executor"
	flytev1 "github.com/flytekube/backend/executor/api/v1"
	"github.com/flytekube/backend/executor/pluginmachinery/core"
	"github.com/flytekube/backend/sandbox"
	"github.com/flytekube/backend/test/nodetest"
)

// secretAction is the TaskAction of examples/08-secret.yaml.
const secretAction = "secret"

// checkSecretExample holds the running sandbox to what examples/08-secret.yaml promises:
// on a real node the kubelet delivered the Secret as a variable, as a file and as a
// directory (the task printed the value's SHA-256 each way), and nothing the system
// records carries the value: not the TaskActions, pods or Kubernetes Events, not the
// services' database, not a log or any other file of the sandbox or the node's logs,
// not a trace in Jaeger, not the sandbox's own output.
func checkSecretExample(ctx context.Context, t *testing.T, e sandbox.Endpoints, printed string) {
	t.Helper()
	if len(e.ExampleSecret) < 32 {
		t.Errorf("the sandbox's example Secret %q is no distinctive random value", e.ExampleSecret)
		return
	}
	c := kubeClient(t, e.Kubeconfig)
	ran := e.NodeDir != "" // without a node the example is left out; the Secret is made all the same
	if ran {
		checkSecretDelivered(ctx, t, c, e)
	}
	leaks := newLeakFinder(e.ExampleSecret)
	leaks.look("the sandbox's output", printed)
	leaks.lookJSON(t, "the TaskActions", listUnstructured(ctx, t, c, "flyte.org/v1", "TaskActionList", client.InNamespace("demo")))
	leaks.lookJSON(t, "the pods", listUnstructured(ctx, t, c, "v1", "PodList", client.InNamespace("demo")))
	leaks.lookJSON(t, "the Kubernetes Events", listUnstructured(ctx, t, c, "v1", "EventList"))
	leaks.lookJSON(t, "the Kubernetes Events (events.k8s.io)", listUnstructured(ctx, t, c, "events.k8s.io/v1", "EventList"))
	dump := dumpDatabase(ctx, t, e.DatabaseURL)
	if ran && !strings.Contains(dump["action_events"], `"action":"`+secretAction+`"`) {
		t.Errorf("the events service holds no event of the %s example; the database was looked at too early", secretAction)
	}
	for table, rows := range dump {
		leaks.look("table "+table+" of the services' database", rows)
	}
	leaks.lookFiles(t, e.Dir)
	if e.NodeDir != "" {
		leaks.lookFiles(t, filepath.Join(e.NodeDir, "logs"))
		leaks.lookFiles(t, filepath.Join(e.NodeDir, "kubelet", "pod-logs"))
	}
	for service, traces := range jaegerTraces(ctx, t, e.JaegerQuery, ran) {
		leaks.look("the traces of "+service+" in Jaeger", traces)
	}
	if leaks.looked < 10 {
		t.Errorf("looked for the Secret's value in only %d places", leaks.looked)
	}
	for _, where := range leaks.found {
		t.Errorf("the Secret's value is in %s", where)
	}
	t.Logf("looked for the example Secret's value in %d places (the secret example ran: %v); found it in %d", leaks.looked, ran, len(leaks.found))
}

// checkSecretDelivered: the secret example succeeded in one attempt, and its container
// printed the SHA-256 of the Secret's value as read from the variable, from the key's
// file and from the whole Secret's directory.
func checkSecretDelivered(ctx context.Context, t *testing.T, c client.Client, e sandbox.Endpoints) {
	t.Helper()
	var ta flytev1.TaskAction
	if err := c.Get(ctx, client.ObjectKey{Namespace: "demo", Name: secretAction}, &ta); err != nil {
		t.Errorf("the %s example: %v", secretAction, err)
		return
	}
	if ta.Status.Phase != flytev1.PhaseSucceeded || ta.Status.Attempts != 1 {
		t.Errorf("the %s example ended %s after %d attempts; want Succeeded after 1", secretAction, ta.Status.Phase, ta.Status.Attempts)
	}
	var pods corev1.PodList
	if err := c.List(ctx, &pods, client.InNamespace("demo"), client.MatchingLabels{core.LabelTaskActionUID: string(ta.UID)}); err != nil || len(pods.Items) != 1 {
		t.Errorf("the %s example's pods: %d (%v); want 1", secretAction, len(pods.Items), err)
		return
	}
	pod := &pods.Items[0]
	// Read from the node's log files, as the kubelet wrote them: never through the API server.
	logs, err := (&nodetest.Node{Dir: e.NodeDir}).Logs(ctx, pod, pod.Spec.Containers[0].Name)
	if err != nil {
		t.Errorf("the %s example's log: %v", secretAction, err)
		return
	}
	sum := sha256.Sum256([]byte(e.ExampleSecret))
	for _, how := range []string{"env", "file", "whole"} {
		want := fmt.Sprintf("%-5s %s  -", how, hex.EncodeToString(sum[:]))
		if !strings.Contains(logs, want) {
			t.Errorf("the %s example's log lacks %q, the Secret's SHA-256 as read by %s:\n%s", secretAction, want, how, logs)
		}
	}
}

// leakFinder looks for a value as it is, hex-encoded (as Postgres shows bytea, such as
// the events' protobuf) and base64-encoded (as a Secret's data is in JSON).
type leakFinder struct {
	forms  []string
	looked int
	found  []string
}

func newLeakFinder(value string) *leakFinder {
	return &leakFinder{forms: []string{value, hex.EncodeToString([]byte(value)), base64.StdEncoding.EncodeToString([]byte(value))}}
}

func (l *leakFinder) look(where, text string) {
	l.looked++
	lower := strings.ToLower(text)
	for _, f := range l.forms {
		if strings.Contains(text, f) || strings.Contains(lower, strings.ToLower(f)) {
			l.found = append(l.found, where)
			return
		}
	}
}

func (l *leakFinder) lookJSON(t *testing.T, where string, v any) {
	t.Helper()
	raw, err := json.Marshal(v)
	if err != nil {
		t.Errorf("%s: %v", where, err)
		return
	}
	l.look(where, string(raw))
}

// lookFiles looks in every regular file under dir.
func (l *leakFinder) lookFiles(t *testing.T, dir string) {
	t.Helper()
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		raw, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		l.look(path, string(raw))
		return nil
	})
	if err != nil {
		t.Errorf("looking in %s: %v", dir, err)
	}
}

func kubeClient(t *testing.T, kubeconfig string) client.Client {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	scheme, err := executor.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// listUnstructured lists objects whole, status and managed fields included, with
// every field the API server keeps, whether or not Go types know it.
func listUnstructured(ctx context.Context, t *testing.T, c client.Client, apiVersion, kind string, opts ...client.ListOption) *unstructured.UnstructuredList {
	t.Helper()
	list := &unstructured.UnstructuredList{}
	list.SetAPIVersion(apiVersion)
	list.SetKind(kind)
	if err := c.List(ctx, list, opts...); err != nil {
		t.Errorf("listing %s %s: %v", apiVersion, kind, err)
	}
	return list
}

// dumpDatabase returns every row of every table of the services' database as JSON
// lines, by table.
func dumpDatabase(ctx context.Context, t *testing.T, databaseURL string) map[string]string {
	t.Helper()
	conn, err := pgx.Connect(ctx, databaseURL)
	if err != nil {
		t.Errorf("the services' database: %v", err)
		return nil
	}
	defer func() { _ = conn.Close(ctx) }()
	rows, err := conn.Query(ctx, `SELECT table_schema, table_name FROM information_schema.tables
		WHERE table_type = 'BASE TABLE' AND table_schema NOT IN ('pg_catalog', 'information_schema')`)
	if err != nil {
		t.Errorf("listing the tables: %v", err)
		return nil
	}
	var tables [][2]string
	for rows.Next() {
		var schema, name string
		if err := rows.Scan(&schema, &name); err != nil {
			t.Errorf("listing the tables: %v", err)
			return nil
		}
		tables = append(tables, [2]string{schema, name})
	}
	if rows.Err() != nil {
		t.Errorf("listing the tables: %v", rows.Err())
	}
	dump := map[string]string{}
	for _, tb := range tables {
		var text string
		q := fmt.Sprintf(`SELECT coalesce(string_agg(row_to_json(t)::text, E'\n'), '') FROM %s t`, pgx.Identifier{tb[0], tb[1]}.Sanitize())
		if err := conn.QueryRow(ctx, q).Scan(&text); err != nil {
			t.Errorf("reading table %s.%s: %v", tb[0], tb[1], err)
			continue
		}
		dump[tb[1]] = text
	}
	if _, ok := dump["action_events"]; !ok {
		t.Errorf("the services' database has no table action_events among %v", tables)
	}
	return dump
}

// jaegerTraces returns, by service, every trace Jaeger holds. Spans reach Jaeger in
// batches: when the secret example ran, it first waits for the executor's trace of it.
func jaegerTraces(ctx context.Context, t *testing.T, query string, ran bool) map[string]string {
	t.Helper()
	get := func(path string, params url.Values) (string, error) {
		req, err := http.NewRequestWithContext(ctx, "GET", query+path+"?"+params.Encode(), nil)
		if err != nil {
			return "", err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return "", err
		}
		defer func() { _ = resp.Body.Close() }()
		raw, err := io.ReadAll(resp.Body)
		if err == nil && resp.StatusCode != http.StatusOK {
			err = fmt.Errorf("%s: %s", resp.Status, raw)
		}
		return string(raw), err
	}
	var some struct{ Data []json.RawMessage }
	traces := func(service string, tags string) (string, error) {
		params := url.Values{"service": {service}, "lookback": {"1h"}, "limit": {"100000"}}
		if tags != "" {
			params.Set("tags", tags)
		}
		return get("/api/traces", params)
	}
	if ran {
		deadline := time.Now().Add(30 * time.Second)
		for {
			raw, err := traces("executor", `{"flyte.action":"`+secretAction+`"}`)
			if err == nil && json.Unmarshal([]byte(raw), &some) == nil && len(some.Data) > 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("Jaeger holds no trace of the %s example after 30 s: %v %.300s", secretAction, err, raw)
				break
			}
			time.Sleep(time.Second)
		}
	}
	raw, err := get("/api/services", nil)
	var services struct{ Data []string }
	if err == nil {
		err = json.Unmarshal([]byte(raw), &services)
	}
	if err != nil || len(services.Data) < 3 {
		t.Errorf("Jaeger's services: %v %s; want the executor's and both services'", err, raw)
	}
	out := map[string]string{}
	for _, s := range services.Data {
		raw, err := traces(s, "")
		if err != nil {
			t.Errorf("the traces of %s: %v", s, err)
			continue
		}
		out[s] = raw
	}
	return out
}
