package main

import (
	"slices"
	"testing"
)

func TestRefs(t *testing.T) {
	tests := []struct {
		name, version, tags string
		want                []string
		wantErr             bool
	}{
		{"the version alone", "v0.2.0", "", []string{"r.example/flyte/events:v0.2.0"}, false},
		{"the version, then the other tags", "v0.2.0", "dev,latest", []string{"r.example/flyte/events:v0.2.0", "r.example/flyte/events:dev", "r.example/flyte/events:latest"}, false},
		{"each once", "v0.2.0", "v0.2.0, dev,,dev", []string{"r.example/flyte/events:v0.2.0", "r.example/flyte/events:dev"}, false},
		{"between releases", "v0.2.0-3-g936b0fa-dirty", "dev", []string{"r.example/flyte/events:v0.2.0-3-g936b0fa-dirty", "r.example/flyte/events:dev"}, false},
		{"not a tag", "v0.2.0+build", "", nil, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := refs("r.example/flyte", "events", tc.version, tc.tags)
			if (err != nil) != tc.wantErr {
				t.Fatalf("error %v; want one: %v", err, tc.wantErr)
			}
			var names []string
			for _, r := range got {
				names = append(names, r.String())
			}
			if !slices.Equal(names, tc.want) {
				t.Errorf("%q; want %q", names, tc.want)
			}
		})
	}
}
