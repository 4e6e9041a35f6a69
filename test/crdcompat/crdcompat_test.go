package crdcompat

import (
	"slices"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/utils/ptr"
)

type schema = apiextensionsv1.JSONSchemaProps

func str(mutate ...func(*schema)) schema {
	s := schema{Type: "string"}
	for _, m := range mutate {
		m(&s)
	}
	return s
}

func object(props map[string]schema, mutate ...func(*schema)) schema {
	s := schema{Type: "object", Properties: props}
	for _, m := range mutate {
		m(&s)
	}
	return s
}

func crd(spec schema, versions ...string) *apiextensionsv1.CustomResourceDefinition {
	if len(versions) == 0 {
		versions = []string{"v1"}
	}
	c := &apiextensionsv1.CustomResourceDefinition{}
	for _, v := range versions {
		root := object(map[string]schema{"spec": spec})
		c.Spec.Versions = append(c.Spec.Versions, apiextensionsv1.CustomResourceDefinitionVersion{Name: v, Served: true,
			Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &root}})
	}
	return c
}

func rule(r string) apiextensionsv1.ValidationRule { return apiextensionsv1.ValidationRule{Rule: r} }

func TestCompare(t *testing.T) {
	base := object(map[string]schema{
		"name":  str(func(s *schema) { s.MaxLength = ptr.To[int64](63) }),
		"mode":  str(func(s *schema) { s.Enum = []apiextensionsv1.JSON{{Raw: []byte(`"a"`)}, {Raw: []byte(`"b"`)}} }),
		"count": {Type: "integer", Minimum: ptr.To(1.0), Maximum: ptr.To(10.0)},
		"args":  {Type: "array", MaxItems: ptr.To[int64](8), Items: &apiextensionsv1.JSONSchemaPropsOrArray{Schema: ptr.To(str())}},
		"env":   {Type: "object", MaxProperties: ptr.To[int64](4), AdditionalProperties: &apiextensionsv1.JSONSchemaPropsOrBool{Allows: true, Schema: ptr.To(str())}},
		"id":    str(func(s *schema) { s.Pattern = "^[a-z]+$" }),
		"cache": object(map[string]schema{"enabled": {Type: "boolean"}}, func(s *schema) {
			s.XValidations = apiextensionsv1.ValidationRules{rule("self.enabled || true")}
		}),
	}, func(s *schema) { s.Required = []string{"name"} })

	tests := []struct {
		name   string
		change func(*schema)
		want   []Change // kinds found, in order
	}{
		{"nothing changed", func(*schema) {}, nil},
		{"a new optional field, with rules of its own", func(s *schema) {
			s.Properties["timeout"] = str(func(s *schema) { s.MaxLength = ptr.To[int64](8); s.Pattern = "^[0-9]+s$" })
		}, nil},
		{"a description changed", func(s *schema) { p := s.Properties["name"]; p.Description = "the name"; s.Properties["name"] = p }, nil},
		{"a bound loosened, a rule dropped, an enum value added", func(s *schema) {
			p := s.Properties["name"]
			p.MaxLength = ptr.To[int64](253)
			s.Properties["name"] = p
			c := s.Properties["cache"]
			c.XValidations = nil
			s.Properties["cache"] = c
			m := s.Properties["mode"]
			m.Enum = append(m.Enum, apiextensionsv1.JSON{Raw: []byte(`"c"`)})
			s.Properties["mode"] = m
		}, nil},
		{"a field removed", func(s *schema) { delete(s.Properties, "id") }, []Change{Removed}},
		{"a type changed", func(s *schema) { s.Properties["count"] = schema{Type: "string"} }, []Change{TypeChanged}},
		{"a field newly required", func(s *schema) { s.Required = append(s.Required, "id") }, []Change{Required}},
		{"an enum on a field that had none", func(s *schema) {
			p := s.Properties["id"]
			p.Enum = []apiextensionsv1.JSON{{Raw: []byte(`"x"`)}}
			s.Properties["id"] = p
		}, []Change{EnumAdded}},
		{"an enum value removed", func(s *schema) {
			p := s.Properties["mode"]
			p.Enum = p.Enum[:1]
			s.Properties["mode"] = p
		}, []Change{EnumValuesRemoved}},
		{"maxLength tightened", func(s *schema) { p := s.Properties["name"]; p.MaxLength = ptr.To[int64](10); s.Properties["name"] = p }, []Change{MaxLength}},
		{"maxLength where there was none, in an array's items", func(s *schema) {
			p := s.Properties["args"]
			p.Items.Schema.MaxLength = ptr.To[int64](100)
			s.Properties["args"] = p
		}, []Change{MaxLength}},
		{"maxItems tightened", func(s *schema) { p := s.Properties["args"]; p.MaxItems = ptr.To[int64](4); s.Properties["args"] = p }, []Change{MaxItems}},
		{"maxProperties tightened", func(s *schema) { p := s.Properties["env"]; p.MaxProperties = ptr.To[int64](2); s.Properties["env"] = p }, []Change{MaxProperties}},
		{"a map's values limited", func(s *schema) {
			p := s.Properties["env"]
			p.AdditionalProperties.Schema.MaxLength = ptr.To[int64](5)
			s.Properties["env"] = p
		}, []Change{MaxLength}},
		{"minimum raised, maximum lowered", func(s *schema) {
			p := s.Properties["count"]
			p.Minimum, p.Maximum = ptr.To(2.0), ptr.To(9.0)
			s.Properties["count"] = p
		}, []Change{Minimum, Maximum}},
		{"minimum made exclusive", func(s *schema) { p := s.Properties["count"]; p.ExclusiveMinimum = true; s.Properties["count"] = p }, []Change{Minimum}},
		{"a pattern added", func(s *schema) { p := s.Properties["name"]; p.Pattern = "^[a-z]+$"; s.Properties["name"] = p }, []Change{Pattern}},
		{"a pattern changed, even to a looser one", func(s *schema) { p := s.Properties["id"]; p.Pattern = "^[a-z0-9]+$"; s.Properties["id"] = p }, []Change{Pattern}},
		{"a rule added on a field that existed", func(s *schema) {
			p := s.Properties["env"]
			p.XValidations = apiextensionsv1.ValidationRules{rule("self.all(k, size(k) <= 8)")}
			s.Properties["env"] = p
		}, []Change{RuleAdded}},
		{"a rule changed", func(s *schema) {
			c := s.Properties["cache"]
			c.XValidations = apiextensionsv1.ValidationRules{rule("self.enabled")}
			s.Properties["cache"] = c
		}, []Change{RuleAdded}},
		{"a rule on the object that holds a new field", func(s *schema) {
			s.XValidations = apiextensionsv1.ValidationRules{rule("!has(self.timeout) || size(self.timeout) < 8")}
		}, []Change{RuleAdded}},
		{"a format added", func(s *schema) { p := s.Properties["id"]; p.Format = "date-time"; s.Properties["id"] = p }, []Change{Format}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			newer := *base.DeepCopy()
			tc.change(&newer)
			got := Compare(crd(base), crd(newer))
			var kinds []Change
			for _, f := range got {
				kinds = append(kinds, f.Change)
			}
			if !slices.Equal(kinds, tc.want) {
				t.Errorf("found %v; want %v", got, tc.want)
			}
		})
	}
}

func TestCompareVersions(t *testing.T) {
	s := object(map[string]schema{"name": str()})
	tests := []struct {
		name       string
		old, newer *apiextensionsv1.CustomResourceDefinition
		want       []Change
	}{
		{"a version added beside", crd(s, "v1"), crd(s, "v1", "v2"), nil},
		{"a version removed", crd(s, "v1", "v2"), crd(s, "v2"), []Change{VersionRemoved}},
		{"a version no longer served", crd(s, "v1"), func() *apiextensionsv1.CustomResourceDefinition {
			c := crd(s, "v1")
			c.Spec.Versions[0].Served = false
			return c
		}(), []Change{VersionNotServed}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var kinds []Change
			for _, f := range Compare(tc.old, tc.newer) {
				kinds = append(kinds, f.Change)
			}
			if !slices.Equal(kinds, tc.want) {
				t.Errorf("found %v; want %v", kinds, tc.want)
			}
		})
	}
}

func TestUnknownFieldsNoLongerKept(t *testing.T) {
	old := object(map[string]schema{"tmpl": {Type: "object", XPreserveUnknownFields: ptr.To(true)}})
	newer := object(map[string]schema{"tmpl": {Type: "object"}})
	got := Compare(crd(old), crd(newer))
	if len(got) != 1 || got[0].Change != PreserveUnknownFieldsDropped || got[0].Path != "v1: .spec.tmpl" {
		t.Errorf("found %v; want one %s at v1: .spec.tmpl", got, PreserveUnknownFieldsDropped)
	}
}

func TestExceptions(t *testing.T) {
	found := []Finding{
		{Path: "v1: .spec.name", Change: MaxLength, Value: "10"},
		{Path: "v1: .spec.env", Change: RuleAdded, Value: "self.all(k, size(k) <= 8)"},
	}
	ex := []Exception{
		{Path: "v1: .spec.env", Change: RuleAdded, Value: "self.all(k, size(k) <= 8)", Reason: "ratcheted", StoredObjects: "unaffected"},
		{Path: "v1: .spec.gone", Change: Removed, Reason: "was never set", StoredObjects: "none had it"},
	}
	unexcused, stale := Excuse(found, ex)
	if len(unexcused) != 1 || unexcused[0].Change != MaxLength {
		t.Errorf("unexcused %v; want the maxLength alone", unexcused)
	}
	if len(stale) != 1 || stale[0].Path != "v1: .spec.gone" {
		t.Errorf("stale %v; want the exception that matched nothing", stale)
	}
	if err := Validate([]Exception{{Path: "p", Change: Removed}}); err == nil {
		t.Error("an exception without a reason was accepted")
	}
}
