package metricstest

import (
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

func TestMissing(t *testing.T) {
	reg := prometheus.NewRegistry()
	watchers := prometheus.NewGauge(prometheus.GaugeOpts{Name: "watchers"})
	watchers.Set(20)
	gets := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gets_total"}, []string{"result"})
	gets.WithLabelValues("hit").Add(2)
	sizes := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "batch_size", Buckets: []float64{10}})
	sizes.Observe(3)
	sizes.Observe(30)
	reg.MustRegister(watchers, gets, sizes)
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	got, err := Samples(Scrape(srv.URL))
	if err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		sample string
		has    bool
	}{
		{"watchers 20", true},
		{"watchers 2", false}, // a prefix of the line, not the value
		{`gets_total{result="hit"} 2`, true},
		{`gets_total{result="hit"} 2.0`, true},
		{`gets_total{result="miss"} 0`, false}, // no such series
		{"gets_total 2", false},                // the series has a label
		{"batch_size_count 2", true},
		{`batch_size_bucket{le="10"} 1`, true},
		{"batch_size_sum 33", true},
	}
	for _, tt := range tests {
		t.Run(tt.sample, func(t *testing.T) {
			problem := missing(got, parse(t, tt.sample))
			if (problem == "") != tt.has {
				t.Fatalf("missing = %q; want the sample found: %v", problem, tt.has)
			}
		})
	}
}
