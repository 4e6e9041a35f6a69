// Package textbound makes text that a task, a pod or a client controls fit a bounded
// field: valid UTF-8, no NUL bytes (Postgres and the protobuf string fields refuse
// them), at most n bytes, cut at a character's start and marked where it was cut.
package textbound

import (
	"strings"
	"unicode/utf8"
)

// Ellipsis marks where Cut shortened a text.
const Ellipsis = "…"

// Cut shortens s to at most n bytes, at a character's start, ending in Ellipsis where it
// cut (when n leaves room for it). The part kept is copied, so that a short field does
// not hold a long text in memory.
func Cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	mark := Ellipsis
	if n < len(mark) {
		mark = ""
	}
	cut := max(n-len(mark), 0)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return strings.Clone(s[:cut]) + mark
}

// Fit makes s valid UTF-8 without NUL bytes, each invalid byte sequence and each NUL
// replaced by U+FFFD, and cuts it to at most n bytes with Cut.
func Fit(s string, n int) string {
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	if strings.IndexByte(s, 0) >= 0 {
		s = strings.ReplaceAll(s, "\x00", "\uFFFD")
	}
	return Cut(s, n)
}
