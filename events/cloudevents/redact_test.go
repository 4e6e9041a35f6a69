package cloudevents

import "testing"

// TestRedact: every byte of every occurrence of a secret goes, runs of them as one
// REDACTED, and the start of a secret at the end of a text that was cut there.
func TestRedact(t *testing.T) {
	s := secrets{"s3cr3tval", "cr3tvalue-tail", "abcd"}
	tests := []struct {
		text string
		cut  bool
		want string
	}{
		{"nothing here", false, "nothing here"},
		{"a s3cr3tval and abcd", false, "a REDACTED and REDACTED"},
		// Overlapping secrets are one.
		{"x s3cr3tvalue-tail y", false, "x REDACTED y"},
		{"abcdabcd", false, "REDACTED"},
		// A secret's start at the end of a cut text goes; a short one stays.
		{"ends with s3cr3", true, "ends with REDACTED"},
		{"ends with s3c", true, "ends with s3c"},
		{"ends with s3cr3", false, "ends with s3cr3"},
	}
	for _, tc := range tests {
		if got := s.redact(tc.text, tc.cut); got != tc.want {
			t.Errorf("redact(%q, %v) = %q, want %q", tc.text, tc.cut, got, tc.want)
		}
	}
}

// TestLegacyName: the name an HTTP sink without name= had before names left the path
// out, by which what was kept under it can be found; nothing for a named sink or a
// broker, whose names have not changed.
func TestLegacyName(t *testing.T) {
	tests := []struct{ sink, want string }{
		{"http: {url: 'https://hooks.example.com/services/T000/B000/XXXX?sig=s', timeout: 1s}", "https://hooks.example.com/services/T000/B000/XXXX"},
		{"http: {url: 'http://receiver.example:8080'}", "http://receiver.example:8080"},
		{"http: {url: 'http://receiver.example/a%2Fb'}", "http://receiver.example/a%2Fb"},
		{"{name: alerts, http: {url: 'https://hooks.example.com/x'}}", ""},
		{"nats: {servers: [nats.example]}", ""},
		{"kafka: {brokers: [k1], topic: t}", ""},
	}
	for _, tc := range tests {
		t.Run(tc.sink, func(t *testing.T) {
			if got := mustDecode(t, tc.sink).LegacyName(); got != tc.want {
				t.Errorf("LegacyName() = %q, want %q", got, tc.want)
			}
		})
	}
}
