// Package crdcompat finds where a CustomResourceDefinition narrows an earlier one: what an
// object stored under the earlier schema, or a client written for it, could meet as a
// refusal under the later one. The API server applies a CRD's schema to every later write
// of objects already stored, status writes included, so a release may add fields and
// loosen rules within a version, and nothing else (docs/crd-versions.md).
//
// A narrowing is a field or version removed, a type or format changed, a field newly
// required, an enum added or values removed, a bound (minimum, maximum, maxLength,
// maxItems, maxProperties and their min* counterparts) added or tightened, a pattern added
// or changed, unknown fields no longer preserved, a list's type changed, or a new or
// changed x-kubernetes-validations rule on a field that existed before. What a new field
// carries is not one: no stored object has it.
package crdcompat

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
)

// Change is the kind of a narrowing.
type Change string

// The narrowings Compare finds.
const (
	VersionRemoved               Change = "version removed"
	VersionNotServed             Change = "version no longer served"
	Removed                      Change = "field removed"
	TypeChanged                  Change = "type changed"
	Format                       Change = "format added or changed"
	Required                     Change = "newly required"
	EnumAdded                    Change = "enum added"
	EnumValuesRemoved            Change = "enum values removed"
	Minimum                      Change = "minimum added or raised"
	Maximum                      Change = "maximum added or lowered"
	MinLength                    Change = "minLength added or raised"
	MaxLength                    Change = "maxLength added or lowered"
	MinItems                     Change = "minItems added or raised"
	MaxItems                     Change = "maxItems added or lowered"
	MinProperties                Change = "minProperties added or raised"
	MaxProperties                Change = "maxProperties added or lowered"
	UniqueItems                  Change = "uniqueItems added"
	Pattern                      Change = "pattern added or changed"
	PreserveUnknownFieldsDropped Change = "unknown fields no longer preserved"
	NullableDropped              Change = "no longer nullable"
	ListType                     Change = "list type or keys changed"
	Combinator                   Change = "allOf, anyOf, oneOf or not added or changed"
	RuleAdded                    Change = "x-kubernetes-validations rule added or changed"
)

// Finding is one narrowing: where (the version and the field's path, such as
// "v1: .spec.container.args[]"), what, and the new value where there is one (the bound,
// the pattern, the rule, the newly required field, the removed enum values).
type Finding struct {
	Path   string `json:"path"`
	Change Change `json:"change"`
	Value  string `json:"value,omitempty"`
}

func (f Finding) String() string {
	if f.Value == "" {
		return f.Path + ": " + string(f.Change)
	}
	return fmt.Sprintf("%s: %s: %s", f.Path, f.Change, f.Value)
}

// Compare lists where newer narrows old, version by version, in a stable order.
func Compare(old, newer *apiextensionsv1.CustomResourceDefinition) []Finding {
	var out []Finding
	for _, ov := range old.Spec.Versions {
		i := slices.IndexFunc(newer.Spec.Versions, func(v apiextensionsv1.CustomResourceDefinitionVersion) bool { return v.Name == ov.Name })
		if i < 0 {
			out = append(out, Finding{Path: ov.Name, Change: VersionRemoved})
			continue
		}
		nv := newer.Spec.Versions[i]
		if ov.Served && !nv.Served {
			out = append(out, Finding{Path: ov.Name, Change: VersionNotServed})
		}
		if ov.Schema == nil || ov.Schema.OpenAPIV3Schema == nil {
			continue // no schema: everything was allowed, and still is or is narrowed below
		}
		var ns *apiextensionsv1.JSONSchemaProps
		if nv.Schema != nil {
			ns = nv.Schema.OpenAPIV3Schema
		}
		if ns == nil {
			continue // a schema dropped allows everything
		}
		c := comparison{version: ov.Name}
		c.schema("", ov.Schema.OpenAPIV3Schema, ns)
		out = append(out, c.found...)
	}
	return out
}

type comparison struct {
	version string
	found   []Finding
}

func (c *comparison) add(path string, change Change, value string) {
	if path == "" {
		path = "."
	}
	c.found = append(c.found, Finding{Path: c.version + ": " + path, Change: change, Value: value})
}

// schema compares the schemas of one field, present in both.
func (c *comparison) schema(path string, o, n *apiextensionsv1.JSONSchemaProps) {
	if o.Type != n.Type {
		c.add(path, TypeChanged, o.Type+" → "+n.Type)
		return // what is below is another thing now
	}
	if o.Format != n.Format && n.Format != "" {
		c.add(path, Format, n.Format)
	}
	for _, r := range n.Required {
		if !slices.Contains(o.Required, r) {
			c.add(path, Required, r)
		}
	}
	c.enum(path, o.Enum, n.Enum)
	c.lower(path, Minimum, o.Minimum, o.ExclusiveMinimum, n.Minimum, n.ExclusiveMinimum)
	c.upper(path, Maximum, o.Maximum, o.ExclusiveMaximum, n.Maximum, n.ExclusiveMaximum)
	c.lowerInt(path, MinLength, o.MinLength, n.MinLength)
	c.upperInt(path, MaxLength, o.MaxLength, n.MaxLength)
	c.lowerInt(path, MinItems, o.MinItems, n.MinItems)
	c.upperInt(path, MaxItems, o.MaxItems, n.MaxItems)
	c.lowerInt(path, MinProperties, o.MinProperties, n.MinProperties)
	c.upperInt(path, MaxProperties, o.MaxProperties, n.MaxProperties)
	if n.UniqueItems && !o.UniqueItems {
		c.add(path, UniqueItems, "")
	}
	if n.Pattern != o.Pattern && n.Pattern != "" {
		c.add(path, Pattern, n.Pattern)
	}
	if isTrue(o.XPreserveUnknownFields) && !isTrue(n.XPreserveUnknownFields) {
		c.add(path, PreserveUnknownFieldsDropped, "")
	}
	if o.Nullable && !n.Nullable {
		c.add(path, NullableDropped, "")
	}
	if deref(o.XListType) != deref(n.XListType) && deref(n.XListType) != "" && deref(n.XListType) != "atomic" ||
		!slices.Equal(o.XListMapKeys, n.XListMapKeys) && len(n.XListMapKeys) > 0 {
		c.add(path, ListType, strings.TrimSpace(deref(n.XListType)+" "+strings.Join(n.XListMapKeys, ",")))
	}
	if !sameJSON(o.AllOf, n.AllOf) || !sameJSON(o.AnyOf, n.AnyOf) || !sameJSON(o.OneOf, n.OneOf) || !sameJSON(o.Not, n.Not) {
		c.add(path, Combinator, "")
	}
	for _, r := range n.XValidations {
		if !slices.ContainsFunc(o.XValidations, func(or apiextensionsv1.ValidationRule) bool { return or.Rule == r.Rule }) {
			c.add(path, RuleAdded, r.Rule)
		}
	}

	for _, name := range slices.Sorted(maps.Keys(o.Properties)) {
		op := o.Properties[name]
		np, ok := n.Properties[name]
		if !ok {
			c.add(path+"."+name, Removed, "")
			continue
		}
		c.schema(path+"."+name, &op, &np)
	}
	if o.Items != nil && o.Items.Schema != nil && n.Items != nil && n.Items.Schema != nil {
		c.schema(path+"[]", o.Items.Schema, n.Items.Schema)
	}
	if o.AdditionalProperties != nil && o.AdditionalProperties.Schema != nil {
		switch ap := n.AdditionalProperties; {
		case ap == nil && len(n.Properties) == 0:
			// Nothing said: any value still goes.
		case ap == nil || !ap.Allows && ap.Schema == nil:
			c.add(path+"{}", Removed, "")
		case ap.Schema != nil:
			c.schema(path+"{}", o.AdditionalProperties.Schema, ap.Schema)
		}
	}
}

func (c *comparison) enum(path string, o, n []apiextensionsv1.JSON) {
	if len(n) == 0 {
		return
	}
	if len(o) == 0 {
		c.add(path, EnumAdded, joinJSON(n))
		return
	}
	var gone []apiextensionsv1.JSON
	for _, v := range o {
		if !slices.ContainsFunc(n, func(w apiextensionsv1.JSON) bool { return bytes.Equal(v.Raw, w.Raw) }) {
			gone = append(gone, v)
		}
	}
	if len(gone) > 0 {
		c.add(path, EnumValuesRemoved, joinJSON(gone))
	}
}

// lower reports a lower bound added, raised, or made exclusive.
func (c *comparison) lower(path string, change Change, o *float64, oExcl bool, n *float64, nExcl bool) {
	switch {
	case n == nil:
	case o == nil, *n > *o, *n == *o && nExcl && !oExcl:
		c.add(path, change, bound(*n, nExcl))
	}
}

// upper reports an upper bound added, lowered, or made exclusive.
func (c *comparison) upper(path string, change Change, o *float64, oExcl bool, n *float64, nExcl bool) {
	switch {
	case n == nil:
	case o == nil, *n < *o, *n == *o && nExcl && !oExcl:
		c.add(path, change, bound(*n, nExcl))
	}
}

func (c *comparison) lowerInt(path string, change Change, o, n *int64) {
	if n != nil && (o == nil || *n > *o) {
		c.add(path, change, strconv.FormatInt(*n, 10))
	}
}

func (c *comparison) upperInt(path string, change Change, o, n *int64) {
	if n != nil && (o == nil || *n < *o) {
		c.add(path, change, strconv.FormatInt(*n, 10))
	}
}

func bound(v float64, exclusive bool) string {
	s := strconv.FormatFloat(v, 'g', -1, 64)
	if exclusive {
		s += " (exclusive)"
	}
	return s
}

func joinJSON(vs []apiextensionsv1.JSON) string {
	parts := make([]string, len(vs))
	for i, v := range vs {
		parts[i] = string(v.Raw)
	}
	return strings.Join(parts, ", ")
}

func sameJSON(a, b any) bool {
	ja, errA := json.Marshal(a)
	jb, errB := json.Marshal(b)
	return errA == nil && errB == nil && bytes.Equal(ja, jb)
}

func isTrue(b *bool) bool { return b != nil && *b }

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// Exception allows one narrowing, found as Path, Change and Value say, for a reason: why
// it is safe, or what it costs (StoredObjects: whether objects stored under the earlier
// schema can break it, and what happens to them then).
type Exception struct {
	Path          string `json:"path"`
	Change        Change `json:"change"`
	Value         string `json:"value,omitempty"`
	Reason        string `json:"reason"`
	StoredObjects string `json:"storedObjects"`
}

func (e Exception) matches(f Finding) bool {
	return e.Path == f.Path && e.Change == f.Change && e.Value == f.Value
}

// Validate refuses exceptions without a reason or a word on stored objects.
func Validate(exceptions []Exception) error {
	var errs []error
	for _, e := range exceptions {
		if strings.TrimSpace(e.Reason) == "" || strings.TrimSpace(e.StoredObjects) == "" {
			errs = append(errs, fmt.Errorf("the exception for %s: %s needs a reason and storedObjects", e.Path, e.Change))
		}
	}
	return errors.Join(errs...)
}

// Excuse returns the findings no exception allows, and the exceptions that allow no
// finding (stale: the narrowing is gone, or the previous release now has it).
func Excuse(found []Finding, exceptions []Exception) (unexcused []Finding, stale []Exception) {
	for _, f := range found {
		if !slices.ContainsFunc(exceptions, func(e Exception) bool { return e.matches(f) }) {
			unexcused = append(unexcused, f)
		}
	}
	for _, e := range exceptions {
		if !slices.ContainsFunc(found, e.matches) {
			stale = append(stale, e)
		}
	}
	return unexcused, stale
}
