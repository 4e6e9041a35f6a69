// Package dashboard is the Grafana dashboard of the three programs, written as code with
// Grafana's Foundation SDK: `make generate` renders it to
// deploy/kustomize/components/monitoring/dashboard.json. Its queries are parsed by
// Prometheus's own parser (promtool, in deploy's tests), and every metric they name is
// checked against the running programs' /metrics (sandbox's tests).
package dashboard

import (
	"encoding/json"
	"fmt"

	"github.com/grafana/grafana-foundation-sdk/go/common"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/prometheus"
	"github.com/grafana/grafana-foundation-sdk/go/timeseries"
)

// UID is the dashboard's identity in Grafana, stable across versions.
const UID = "flyte-backend"

// Panel is one graph: its title, unit and queries (PromQL, with the variables
// $namespace, the namespaces the programs run in, and Grafana's $__rate_interval).
type Panel struct {
	Title, Description, Unit string
	Queries                  []Query
}

// Query is one series of a panel.
type Query struct {
	Expr, Legend string
}

// sel is the selector every query carries: the programs in the chosen namespaces.
const sel = `namespace=~"$namespace"`

// Rows are the dashboard's sections, in order.
var Rows = []struct {
	Title  string
	Panels []Panel
}{
	{"Actions", []Panel{
		{Title: "Actions by phase", Unit: "short", Description: "TaskActions the executor holds, by phase (finished ones until they are collected).",
			Queries: []Query{{`sum by (phase) (flyte_executor_actions{` + sel + `})`, "{{phase}}"}}},
		{Title: "Throughput", Unit: "ops", Description: "Actions ending a second, by how they ended.",
			Queries: []Query{{`sum by (phase) (rate(flyte_executor_phase_changes_total{` + sel + `, phase=~"Succeeded|Failed|Aborted|TimedOut"}[$__rate_interval]))`, "{{phase}}"}}},
		{Title: "Reconcile latency", Unit: "s", Description: "Time of one reconcile of one action.",
			Queries: []Query{
				{`histogram_quantile(0.5, sum by (le) (rate(flyte_executor_reconcile_duration_seconds_bucket{` + sel + `}[$__rate_interval])))`, "p50"},
				{`histogram_quantile(0.99, sum by (le) (rate(flyte_executor_reconcile_duration_seconds_bucket{` + sel + `}[$__rate_interval])))`, "p99"},
			}},
		{Title: "Retries", Unit: "ops", Description: "Steps tried again: new attempts on spec.retries (user), on maxSystemFailures (system), or a step repeated after a transient error.",
			Queries: []Query{{`sum by (kind) (rate(flyte_executor_retries_total{` + sel + `}[$__rate_interval]))`, "{{kind}}"}}},
		{Title: "Backoff", Unit: "s", Description: "Waits scheduled between attempts and for resources, p90.",
			Queries: []Query{{`histogram_quantile(0.9, sum by (le, kind) (rate(flyte_executor_backoff_seconds_bucket{` + sel + `}[$__rate_interval])))`, "{{kind}}"}}},
	}},
	{"Events delivery", []Panel{
		{Title: "Delivery backlog", Unit: "short", Description: "Actions whose phase changes wait for the events service, and of them those held after the service refused their events (an events service older than the executor, most often).",
			Queries: []Query{
				{`sum by (pod) (flyte_executor_events_undelivered_actions{` + sel + `})`, "{{pod}}"},
				{`sum by (pod) (flyte_executor_events_refused_actions{` + sel + `})`, "{{pod}} held after refusals"},
			}},
		{Title: "Delivery lag", Unit: "s", Description: "From a phase change to the events service's acknowledgement.",
			Queries: []Query{
				{`histogram_quantile(0.5, sum by (le) (rate(flyte_executor_events_delivery_lag_seconds_bucket{` + sel + `}[$__rate_interval])))`, "p50"},
				{`histogram_quantile(0.99, sum by (le) (rate(flyte_executor_events_delivery_lag_seconds_bucket{` + sel + `}[$__rate_interval])))`, "p99"},
			}},
		{Title: "Delivered and failed", Unit: "ops", Description: "Events acknowledged, Record calls that failed (retried), offers the service refused (held and offered again), events given up on after eventsDelivery.maxRefusals.",
			Queries: []Query{
				{`sum(rate(flyte_executor_events_delivered_total{` + sel + `}[$__rate_interval]))`, "delivered"},
				{`sum(rate(flyte_executor_events_delivery_failures_total{` + sel + `}[$__rate_interval]))`, "failed calls"},
				{`sum by (code) (rate(flyte_executor_events_refusals_total{` + sel + `}[$__rate_interval]))`, "refused offers ({{code}})"},
				{`sum(rate(flyte_executor_events_refused_total{` + sel + `}[$__rate_interval]))`, "given up"},
			}},
	}},
	{"Cache", []Panel{
		{Title: "Cache hit ratio", Unit: "percentunit", Description: "Lookups answered by a stored entry, of those that could be.",
			Queries: []Query{{`sum(rate(flyte_executor_cache_lookups_total{` + sel + `, result="hit"}[$__rate_interval])) / sum(rate(flyte_executor_cache_lookups_total{` + sel + `, result=~"hit|miss|stale"}[$__rate_interval]))`, "hit ratio"}}},
		{Title: "Cache lookups", Unit: "ops", Description: "The executor's cache lookups by result.",
			Queries: []Query{{`sum by (result) (rate(flyte_executor_cache_lookups_total{` + sel + `}[$__rate_interval]))`, "{{result}}"}}},
		{Title: "Reservations", Unit: "ops", Description: "Reservations granted, extended, taken over from a holder that stopped renewing, refused.",
			Queries: []Query{{`sum by (result) (rate(flyte_cache_reservations_total{` + sel + `}[$__rate_interval]))`, "{{result}}"}}},
	}},
	{"Services", []Panel{
		{Title: "RPC rate", Unit: "reqps", Description: "Calls served, by service and method.",
			Queries: []Query{{`sum by (job, rpc_method) (rate(rpc_server_call_duration_seconds_count{` + sel + `}[$__rate_interval]))`, "{{job}} {{rpc_method}}"}}},
		{Title: "RPC errors", Unit: "reqps", Description: "Calls that failed, by service, method and error.",
			Queries: []Query{{`sum by (job, rpc_method, error_type) (rate(rpc_server_call_duration_seconds_count{` + sel + `, error_type!=""}[$__rate_interval]))`, "{{job}} {{rpc_method}} {{error_type}}"}}},
		{Title: "RPC latency p99", Unit: "s", Description: "Latency of calls served, by service and method.",
			Queries: []Query{{`histogram_quantile(0.99, sum by (le, job, rpc_method) (rate(rpc_server_call_duration_seconds_bucket{` + sel + `}[$__rate_interval])))`, "{{job}} {{rpc_method}}"}}},
		{Title: "Calls refused", Unit: "reqps", Description: "Calls refused as unauthenticated or forbidden.",
			Queries: []Query{{`sum by (job, reason) (rate(flyte_rpc_denied_total{` + sel + `}[$__rate_interval]))`, "{{job}} {{reason}}"}}},
	}},
	{"CloudEvents egress", []Panel{
		{Title: "Published", Unit: "ops", Description: "Events each sink acknowledged, and those it refused for good.",
			Queries: []Query{
				{`sum by (sink) (rate(flyte_events_cloudevents_published_total{` + sel + `}[$__rate_interval]))`, "{{sink}}"},
				{`sum by (sink) (rate(flyte_events_cloudevents_dead_letters_total{` + sel + `}[$__rate_interval]))`, "{{sink}} dead letters"},
			}},
		{Title: "Sink backlog", Unit: "short", Description: "Events recorded and not yet handed to each sink.",
			Queries: []Query{{`max by (sink) (flyte_events_cloudevents_pending{` + sel + `})`, "{{sink}}"}}},
		{Title: "Oldest pending event", Unit: "s", Description: "Age of each sink's oldest pending event.",
			Queries: []Query{{`max by (sink) (flyte_events_cloudevents_oldest_pending_age_seconds{` + sel + `})`, "{{sink}}"}}},
	}},
}

// JSON renders the dashboard as Grafana imports it.
func JSON() ([]byte, error) {
	b := dashboard.NewDashboardBuilder("Flyte backend").
		Uid(UID).
		Tags([]string{"flyte"}).
		Description("The executor, the events service and the cache service. Generated by deploy/dashboard: edit it there.").
		Refresh("30s").
		Time("now-3h", "now").
		Timezone(common.TimeZoneBrowser).
		Tooltip(dashboard.DashboardCursorSyncCrosshair).
		WithVariable(dashboard.NewDatasourceVariableBuilder("datasource").Label("Data source").Type("prometheus")).
		WithVariable(dashboard.NewQueryVariableBuilder("namespace").Label("Namespace").
			Datasource(datasource()).
			Query(dashboard.StringOrMap{String: new(`label_values(flyte_executor_actions, namespace)`)}).
			Multi(true).IncludeAll(true).AllValue(".*").
			Refresh(dashboard.VariableRefreshOnTimeRangeChanged))
	for _, row := range Rows {
		b = b.WithRow(dashboard.NewRowBuilder(row.Title))
		for _, p := range row.Panels {
			panel := timeseries.NewPanelBuilder().Title(p.Title).Description(p.Description).Unit(p.Unit).
				Datasource(datasource()).Height(8).Span(8)
			for i, q := range p.Queries {
				panel = panel.WithTarget(prometheus.NewDataqueryBuilder().Expr(q.Expr).LegendFormat(q.Legend).RefId(string(rune('A' + i))))
			}
			b = b.WithPanel(panel)
		}
	}
	d, err := b.Build()
	if err != nil {
		return nil, fmt.Errorf("dashboard: %w", err)
	}
	out, err := json.MarshalIndent(d, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("dashboard: %w", err)
	}
	return append(out, '\n'), nil
}

func datasource() common.DataSourceRef {
	return common.DataSourceRef{Type: new("prometheus"), Uid: new("${datasource}")}
}
