package service

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"hash/fnv"
	"strconv"
	"time"

	"github.com/flytekube/backend/events/store"
)

// Page tokens are opaque to clients: base64url JSON carrying the position and a
// fingerprint of the query, so a token replayed against a different query is refused
// instead of silently skipping rows.
//
// An event's position holds its time in microseconds since the epoch, the database's
// precision, which covers every time Postgres stores (nanoseconds overflow before 1678
// and after 2262). Attempts start at 1, so attempt 0 means "from the first event": a
// time of 0 (the epoch) is a time like any other.
type pageToken struct {
	Query          string `json:"q"`
	ID             int64  `json:"id,omitempty"`
	Attempt        uint32 `json:"a,omitempty"`
	OccurredMicros int64  `json:"us,omitempty"`
	Phase          int16  `json:"p,omitempty"`
	Version        uint32 `json:"v,omitempty"`
}

// eventToken is the token of the page after the event at c.
func eventToken(query string, c store.EventCursor) pageToken {
	return pageToken{Query: query, Attempt: c.Attempt, OccurredMicros: c.OccurredAt.UnixMicro(), Phase: c.Phase, Version: c.Version}
}

// eventCursor is the position a token of ListActionEvents continues after.
func (t pageToken) eventCursor() store.EventCursor {
	if t.Attempt == 0 {
		return store.EventCursor{}
	}
	return store.EventCursor{Attempt: t.Attempt, OccurredAt: time.UnixMicro(t.OccurredMicros).UTC(), Phase: t.Phase, Version: t.Version}
}

var errBadToken = errors.New("page_token: not a token of this listing; start again without one")

func fingerprint(parts ...string) string {
	h := fnv.New64a()
	for _, p := range parts {
		_, _ = h.Write([]byte(p))
		_, _ = h.Write([]byte{0})
	}
	return strconv.FormatUint(h.Sum64(), 36)
}

func encodeToken(t pageToken) string {
	b, _ := json.Marshal(t) // a struct of plain fields always encodes
	return base64.RawURLEncoding.EncodeToString(b)
}

// decodeToken parses s for the query q; an empty s is the first page.
func decodeToken(s, q string) (pageToken, error) {
	if s == "" {
		return pageToken{Query: q}, nil
	}
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return pageToken{}, errBadToken
	}
	var t pageToken
	if err := json.Unmarshal(b, &t); err != nil || t.Query != q {
		return pageToken{}, errBadToken
	}
	return t, nil
}
