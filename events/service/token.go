package service

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"hash/fnv"
	"strconv"
)

// Page tokens are opaque to clients: base64url JSON carrying the position and a
// fingerprint of the query, so a token replayed against a different query is refused
// instead of silently skipping rows.
type pageToken struct {
	Query    string `json:"q"`
	ID       int64  `json:"id,omitempty"`
	Attempt  uint32 `json:"a,omitempty"`
	Occurred int64  `json:"t,omitempty"` // unix nanoseconds
	Phase    int16  `json:"p,omitempty"`
	Version  uint32 `json:"v,omitempty"`
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
