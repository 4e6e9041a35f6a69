package eventsink

import (
	"strings"
	"unicode/utf8"
)

// Bounds of the events contract (proto/flyte/events/v1/events.proto and
// flyte/core/v1/error.proto), in characters.
const (
	maxReason         = 256
	maxMessage        = 65536
	maxErrorCode      = 256
	maxEventObject    = 512
	maxEventType      = 32
	maxEventMessage   = 4096
	maxLinkName       = 128
	maxLinkURI        = 2048
	maxClusterEvents  = 100
	maxLogLinks       = 20
	truncationMarker  = "…"
	replacementString = "\uFFFD"
)

// clean makes text from outside the executor (Kubernetes events anyone in a namespace may
// write, messages of user code) fit the contract: NULs dropped, invalid UTF-8 replaced,
// and cut to max characters with a marker. The events service would refuse the event
// otherwise, and refuse it again on every redelivery.
func clean(s string, max int) string {
	if strings.IndexByte(s, 0) >= 0 {
		s = strings.ReplaceAll(s, "\x00", "")
	}
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, replacementString)
	}
	if utf8.RuneCountInString(s) <= max {
		return s
	}
	cut, n := 0, 0
	for i := range s {
		if n == max-1 {
			cut = i
			break
		}
		n++
	}
	return s[:cut] + truncationMarker
}
