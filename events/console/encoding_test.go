package console

import "testing"

func TestAcceptsGzip(t *testing.T) {
	for _, c := range []struct {
		headers []string
		want    bool
	}{
		{nil, false},
		{[]string{""}, false},
		{[]string{"gzip"}, true},
		{[]string{"gzip, deflate, br, zstd"}, true}, // Chromium's
		{[]string{"br", "GZIP"}, true},
		{[]string{"x-gzip"}, true},
		{[]string{"identity"}, false},
		{[]string{"gzip;q=0"}, false},
		{[]string{"gzip; q=0.000"}, false},
		{[]string{"gzip;q=0.5"}, true},
		{[]string{"gzip;q=nonsense"}, false},
		{[]string{"*"}, true},
		{[]string{"*;q=0"}, false},
		{[]string{"*, gzip;q=0"}, false}, // named beats the wildcard
		{[]string{"gzip, *;q=0"}, true},
		{[]string{"gzipped"}, false},
	} {
		if got := acceptsGzip(c.headers); got != c.want {
			t.Errorf("acceptsGzip(%q) = %v, want %v", c.headers, got, c.want)
		}
	}
}
