// Package metricstest checks a Prometheus endpoint in tests the way Prometheus reads it:
// the scrape is decoded by expfmt, so series are told apart by name and label set and
// values compared as numbers, not found as substrings of the text (where
// "watchers 2" is also in "watchers 20").
package metricstest

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Scrape is a prometheus.Gatherer that scrapes url, so that prometheus/testutil's Gather*
// functions check what a Prometheus server would see there.
func Scrape(url string) prometheus.Gatherer {
	return prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		resp, err := http.Get(url)
		if err != nil {
			return nil, fmt.Errorf("scraping %s: %w", url, err)
		}
		defer func() { _ = resp.Body.Close() }()
		if resp.StatusCode != http.StatusOK {
			return nil, fmt.Errorf("scraping %s: %s", url, resp.Status)
		}
		return decode(expfmt.NewDecoder(resp.Body, expfmt.ResponseFormat(resp.Header)))
	})
}

func decode(dec expfmt.Decoder) ([]*dto.MetricFamily, error) {
	var families []*dto.MetricFamily
	for {
		f := &dto.MetricFamily{}
		err := dec.Decode(f)
		if errors.Is(err, io.EOF) {
			return families, nil
		}
		if err != nil {
			return nil, err
		}
		families = append(families, f)
	}
}

// Samples gathers g and flattens what it has into samples, a histogram into its
// _bucket, _sum and _count series, as Prometheus stores them.
func Samples(g prometheus.Gatherer) (model.Vector, error) {
	families, err := g.Gather()
	if err != nil {
		return nil, err
	}
	return expfmt.ExtractSamples(&expfmt.DecodeOptions{}, families...)
}

// Require fails the test for each of want that g does not have with that value. Each is
// a line of the text exposition format, such as `requests_total{code="200"} 3`, naming
// the series by all its labels.
func Require(t testing.TB, g prometheus.Gatherer, want ...string) {
	t.Helper()
	got, err := Samples(g)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range want {
		if problem := missing(got, parse(t, w)); problem != "" {
			t.Error(problem)
		}
	}
}

// Has reports whether g has every one of want with its value (see Require).
func Has(t testing.TB, g prometheus.Gatherer, want ...string) bool {
	t.Helper()
	got, err := Samples(g)
	if err != nil {
		return false
	}
	for _, w := range want {
		if missing(got, parse(t, w)) != "" {
			return false
		}
	}
	return true
}

// Text reads samples in the text exposition format, such as a /metrics body fetched
// some other way.
func Text(r io.Reader) (model.Vector, error) {
	families, err := decode(expfmt.NewDecoder(r, expfmt.NewFormat(expfmt.TypeTextPlain)))
	if err != nil {
		return nil, err
	}
	return expfmt.ExtractSamples(&expfmt.DecodeOptions{}, families...)
}

// parse reads one sample in the text exposition format.
func parse(t testing.TB, line string) *model.Sample {
	t.Helper()
	samples, err := Text(strings.NewReader(line + "\n"))
	if err != nil || len(samples) != 1 {
		t.Fatalf("metricstest: %q is not one sample (%v)", line, err)
	}
	return samples[0]
}

// missing says how got lacks want, or "" when it has it.
func missing(got model.Vector, want *model.Sample) string {
	for _, s := range got {
		if s.Metric.Equal(want.Metric) {
			if s.Value.Equal(want.Value) {
				return ""
			}
			return fmt.Sprintf("%s is %s; want %s", want.Metric, s.Value, want.Value)
		}
	}
	return fmt.Sprintf("no series %s", want.Metric)
}
