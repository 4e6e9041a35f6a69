package benchutil

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestPercentileAndMedian(t *testing.T) {
	var ds []time.Duration
	for i := 100; i >= 1; i-- { // out of order: Percentile sorts
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	for _, tt := range []struct {
		p    float64
		want time.Duration
	}{{0.5, 50 * time.Millisecond}, {0.99, 99 * time.Millisecond}, {1, 100 * time.Millisecond}, {0.001, time.Millisecond}} {
		if got := Percentile(ds, tt.p); got != tt.want {
			t.Errorf("Percentile(1..100 ms, %v) = %v; want %v", tt.p, got, tt.want)
		}
	}
	if ds[0] != 100*time.Millisecond {
		t.Error("Percentile reordered its argument")
	}
	if got := Median([]float64{3, 1, 2}); got != 2 {
		t.Errorf("Median(3, 1, 2) = %v", got)
	}
	if Percentile(nil, 0.5) != 0 || Median(nil) != 0 {
		t.Error("no values must give 0")
	}
}

func TestRunForStopsAtTheFirstError(t *testing.T) {
	boom := errors.New("boom")
	start := time.Now()
	res, err := RunFor(context.Background(), 4, time.Minute, func(ctx context.Context, client, i int) error {
		if client == 0 && i == 3 {
			return boom
		}
		select {
		case <-ctx.Done(): // the others see the run stop
			return ctx.Err()
		case <-time.After(time.Millisecond):
			return nil
		}
	})
	if !errors.Is(err, boom) || time.Since(start) > 10*time.Second {
		t.Fatalf("RunFor = %v after %v; want the first error, at once", err, time.Since(start))
	}
	if res.Ops < 3 || len(res.Latencies) != res.Ops {
		t.Errorf("%d operations, %d latencies; want the three before the error at least", res.Ops, len(res.Latencies))
	}
}
