package instrument_test

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/flytekube/backend/internal/instrument"
)

// TestKnownLabelValuesStartAtZero: a vector's known values are series before their first
// event, and Register reports a name registered twice.
func TestKnownLabelValuesStartAtZero(t *testing.T) {
	reg := prometheus.NewRegistry()
	gets := instrument.CounterVec("test_gets_total", "Gets by result.", "result", "hit", "miss")
	took := instrument.HistogramVec("test_took_seconds", "Time taken, by outcome.", []float64{1}, "outcome", "ok")
	queued := instrument.GaugeVec("test_queued", "Queued, by sink.", "sink", "http")
	if err := instrument.Register(reg, gets, took, queued, instrument.Counter("test_other_total", "Others.")); err != nil {
		t.Fatal(err)
	}
	want := `
# HELP test_gets_total Gets by result.
# TYPE test_gets_total counter
test_gets_total{result="hit"} 0
test_gets_total{result="miss"} 0
# HELP test_queued Queued, by sink.
# TYPE test_queued gauge
test_queued{sink="http"} 0
# HELP test_took_seconds Time taken, by outcome.
# TYPE test_took_seconds histogram
test_took_seconds_bucket{outcome="ok",le="1"} 0
test_took_seconds_bucket{outcome="ok",le="+Inf"} 0
test_took_seconds_sum{outcome="ok"} 0
test_took_seconds_count{outcome="ok"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "test_gets_total", "test_queued", "test_took_seconds"); err != nil {
		t.Fatal(err)
	}
	if err := instrument.Register(reg, instrument.Gauge("test_fresh", "A new gauge."), instrument.Counter("test_other_total", "Others.")); err == nil {
		t.Fatal("registering test_other_total twice: no error")
	}
}
