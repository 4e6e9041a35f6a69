package textbound

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestCutAndFit(t *testing.T) {
	tests := []struct {
		name string
		fit  bool
		in   string
		n    int
		want string
	}{
		{name: "short enough", in: "abc", n: 3, want: "abc"},
		{name: "cut with the mark", in: "abcdefgh", n: 6, want: "abc…"},
		{name: "never splits a character", in: "ab€€", n: 7, want: "ab…"},
		{name: "no room for the mark", in: "abcdef", n: 2, want: "ab"},
		{name: "nothing kept", in: "€€", n: 0, want: ""},
		{name: "fit replaces NUL", fit: true, in: "a\x00b", n: 10, want: "a\uFFFDb"},
		{name: "fit replaces invalid UTF-8", fit: true, in: "a\xffb", n: 10, want: "a\uFFFDb"},
		{name: "fit cuts after cleaning", fit: true, in: "\x00\x00\x00", n: 7, want: "\uFFFD…"},
		{name: "two-byte characters", fit: true, in: strings.Repeat("é", 600), n: 1024, want: strings.Repeat("é", 510) + "…"},
		{name: "cut lands inside a character", fit: true, in: "aé" + strings.Repeat("x", 10), n: 5, want: "a…"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Cut(tt.in, tt.n)
			if tt.fit {
				got = Fit(tt.in, tt.n)
			}
			if got != tt.want {
				t.Fatalf("got %q, want %q", got, tt.want)
			}
			if len(got) > tt.n || !utf8.ValidString(got) || tt.fit && strings.IndexByte(got, 0) >= 0 {
				t.Fatalf("%q: %d bytes of at most %d, valid UTF-8 %v", got, len(got), tt.n, utf8.ValidString(got))
			}
		})
	}
}
