package flytek8s

import (
	"encoding/json"
	"slices"
)

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
