package config

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"reflect"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// Load reads the YAML file at path over Default, so that fields the file omits keep their
// defaults, and validates the result. Unknown fields are rejected because a misspelt key
// would otherwise be ignored without a word. An empty path means no file: the defaults alone.
func Load(path string) (Config, error) {
	return LoadFiles(path)
}

// LoadFiles is Load for several files, layered in order: each is decoded, as strictly as
// Load decodes one, over what Default and the files before it gave, so that a deployment
// can keep its shipped file as is and add one with its own few changes. A key a later file
// names wins; one it leaves out keeps the earlier value; structs and maps merge member by
// member, as JSON decodes into an existing value; lists are replaced whole. Validation
// runs once, on the result, so a value one file gets wrong another may put right; its
// errors name every file, since the result is all of theirs. Empty paths name no file,
// and none at all mean the defaults alone.
func LoadFiles(paths ...string) (Config, error) {
	cfg := Default()
	var named []string
	for _, path := range paths {
		if path == "" {
			continue
		}
		named = append(named, path)
		if err := decodeFile(path, &cfg); err != nil {
			return Config{}, err
		}
	}
	source := "defaults"
	if len(named) > 0 {
		source = strings.Join(named, ", ")
	}
	if err := cfg.Validate(); err != nil {
		return Config{}, fmt.Errorf("config: %s: %w", source, err)
	}
	return cfg, nil
}

// decodeFile decodes the YAML file at path strictly over cfg.
func decodeFile(path string, cfg *Config) error {
	data, err := os.ReadFile(path)
	if err != nil {
		// The *fs.PathError already names the file.
		return fmt.Errorf("config: %w", err)
	}
	if err := removedFields(data); err != nil {
		return fmt.Errorf("config: %s: %w", path, err)
	}
	var top map[string]json.RawMessage
	if yaml.Unmarshal(data, &top) == nil { // otherwise UnmarshalStrict reports it
		clearNamedLists(reflect.ValueOf(cfg).Elem(), top)
	}
	if err := yaml.UnmarshalStrict(data, cfg); err != nil {
		return fmt.Errorf("config: %s: %w", path, err)
	}
	return nil
}

// clearNamedLists sets to nil every list in the struct v that the object members names,
// at any depth of the structs it names, so that decoding replaces the list whole:
// encoding/json decodes a list's elements into the elements already there, so a later
// file's log link or toleration would keep the fields it leaves out from an earlier
// file's. Members match fields by json name, exactly or else ignoring case, as
// encoding/json matches them.
func clearNamedLists(v reflect.Value, members map[string]json.RawMessage) {
	for i := range v.NumField() {
		f, field := v.Type().Field(i), v.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if !f.IsExported() || name == "-" {
			continue
		}
		if f.Anonymous && name == "" && field.Kind() == reflect.Struct {
			clearNamedLists(field, members) // its fields are members of this object
			continue
		}
		if name == "" {
			name = f.Name
		}
		raw, ok := members[name]
		for k, r := range members {
			if !ok && strings.EqualFold(k, name) {
				raw, ok = r, true
			}
		}
		if !ok {
			continue
		}
		switch field.Kind() {
		case reflect.Slice:
			field.SetZero()
		case reflect.Struct:
			var nested map[string]json.RawMessage
			if json.Unmarshal(raw, &nested) == nil { // null or not an object: nothing to clear
				clearNamedLists(field, nested)
			}
		}
	}
}

// removed are fields the configuration once had, with why they went, so that a file
// still setting one is told more than "unknown field".
var removed = map[string]string{
	"webhookCertPath": webhookRemoved,
	"webhookCertName": webhookRemoved,
	"webhookCertKey":  webhookRemoved,
}

const webhookRemoved = "removed: the executor serves no webhook. An action's secrets are " +
	"delivered to its pod by the kubelet (spec.secrets); docs/configuration.md says why"

// removedFields reports the removed fields data sets.
func removedFields(data []byte) error {
	var top map[string]json.RawMessage
	if err := yaml.Unmarshal(data, &top); err != nil {
		return nil // UnmarshalStrict reports it
	}
	var errs []string
	for _, k := range slices.Sorted(maps.Keys(top)) {
		if why, ok := removed[k]; ok {
			errs = append(errs, k+": "+why)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return nil
}

// UnmarshalJSON decodes the members present in data, keeping the current value of the rest.
// It exists so that a bad duration is reported with its YAML path; see decodeDurations.
func (b *RetryBackoff) UnmarshalJSON(data []byte) error {
	return decodeDurations(data, "retryBackoff", map[string]*metav1.Duration{
		"base": &b.Base,
		"cap":  &b.Cap,
	})
}

// UnmarshalJSON decodes the members present in data, keeping the current value of the rest.
// It exists so that a bad duration is reported with its YAML path; see decodeDurations.
func (g *GCConfig) UnmarshalJSON(data []byte) error {
	var members map[string]json.RawMessage
	if err := json.Unmarshal(data, &members); err != nil {
		return fmt.Errorf("gc: must be a mapping")
	}
	numbers := map[string]any{"maxFinished": &g.MaxFinished, "maxFinishedPerNamespace": &g.MaxFinishedPerNamespace,
		"deletesPerSecond": &g.DeletesPerSecond}
	durations := map[string]json.RawMessage{}
	for _, name := range slices.Sorted(maps.Keys(members)) {
		field, ok := numbers[name]
		switch raw := members[name]; {
		case !ok:
			durations[name] = raw
		case strings.TrimSpace(string(raw)) == "null":
		default:
			if err := json.Unmarshal(raw, field); err != nil {
				return fmt.Errorf("gc.%s: must be a number, got %s", name, raw)
			}
		}
	}
	rest, err := json.Marshal(durations)
	if err != nil {
		return fmt.Errorf("gc: %w", err)
	}
	return decodeDurations(rest, "gc", map[string]*metav1.Duration{
		"interval": &g.Interval,
		"maxTTL":   &g.MaxTTL,
	})
}

// decodeDurations decodes a JSON object whose members are all durations into fields, keyed
// by member name (which must match the struct's json tags). It replaces encoding/json's own
// decoding for two reasons: encoding/json passes on an error from metav1.Duration's
// UnmarshalJSON without saying which field it came from, and metav1.Duration refuses a bare
// 0, which is the natural way to write "disabled". Like UnmarshalStrict it rejects unknown
// members, and like encoding/json it treats null as "leave unchanged".
func decodeDurations(data []byte, prefix string, fields map[string]*metav1.Duration) error {
	var members map[string]json.RawMessage
	if err := json.Unmarshal(data, &members); err != nil {
		return fmt.Errorf("%s: must be a mapping", prefix)
	}
	// Sorted, so that a file with several mistakes always reports the same one.
	for _, name := range slices.Sorted(maps.Keys(members)) {
		field, ok := fields[name]
		if !ok {
			return fmt.Errorf("%s.%s: unknown field", prefix, name)
		}
		switch raw := strings.TrimSpace(string(members[name])); raw {
		case "null":
		case "0":
			field.Duration = 0
		default:
			if !strings.HasPrefix(raw, `"`) {
				return fmt.Errorf("%s.%s: %s is not a duration: want a string such as \"30s\" or \"5m\"", prefix, name, raw)
			}
			if err := field.UnmarshalJSON([]byte(raw)); err != nil {
				return fmt.Errorf("%s.%s: %w", prefix, name, err)
			}
		}
	}
	return nil
}
