// Package instrument declares Prometheus instruments the way every program of this
// project does: one line each, a vector's one label with the values it is known to take,
// which start at zero (so that a series is there before its first event and a rate over
// it is right from the start), and all of them registered at once.
package instrument

import "github.com/prometheus/client_golang/prometheus"

// Counter is a counter without labels.
func Counter(name, help string) prometheus.Counter {
	return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
}

// CounterVec is a counter with one label; each of values starts at zero.
func CounterVec(name, help, label string, values ...string) *prometheus.CounterVec {
	v := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, []string{label})
	for _, value := range values {
		v.WithLabelValues(value)
	}
	return v
}

// Gauge is a gauge without labels.
func Gauge(name, help string) prometheus.Gauge {
	return prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help})
}

// GaugeVec is a gauge with one label; each of values starts at zero.
func GaugeVec(name, help, label string, values ...string) *prometheus.GaugeVec {
	v := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, []string{label})
	for _, value := range values {
		v.WithLabelValues(value)
	}
	return v
}

// Histogram is a histogram without labels.
func Histogram(name, help string, buckets []float64) prometheus.Histogram {
	return prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets})
}

// HistogramVec is a histogram with one label; each of values starts empty.
func HistogramVec(name, help string, buckets []float64, label string, values ...string) *prometheus.HistogramVec {
	v := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, []string{label})
	for _, value := range values {
		v.WithLabelValues(value)
	}
	return v
}

// Register registers each collector with reg, stopping at the first that fails.
func Register(reg prometheus.Registerer, cs ...prometheus.Collector) error {
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}
