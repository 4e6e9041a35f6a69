package store

import (
	"fmt"

	"github.com/flytekube/backend/services/postgres"
)

// FieldError is a string the store will not write or look up. Postgres text holds
// neither NUL nor invalid UTF-8, and every stored string is bounded: the contract
// refuses such values first, and this keeps them from the database (which would answer
// with an error of its own) should a value get past it.
type FieldError struct {
	Field, Problem string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Problem }

// Bounds in bytes of the stored strings: the contract's bounds in characters, times
// four (the longest UTF-8 encoding of one) where the contract does not keep to ASCII.
const (
	maxNameBytes         = 63 // DNS labels: project, domain, run, action
	maxTaskNameBytes     = 255
	maxKeyPartBytes      = 128 // cache version, signature, inputs hash
	maxOwnerIDBytes      = 256 * 4
	maxOutputURIBytes    = 2048 * 4
	maxIdentityNameBytes = 1024 // authenticated user names; Kubernetes' are far shorter
)

// textField is one string to store, with its name for errors and its bound.
type textField struct {
	name, value string
	maxBytes    int
}

// checkTexts returns a *FieldError for the first field that cannot be stored as text.
func checkTexts(fields ...textField) error {
	for _, f := range fields {
		if len(f.value) > f.maxBytes {
			return &FieldError{f.name, fmt.Sprintf("longer than %d bytes", f.maxBytes)}
		}
		if problem := postgres.TextProblem(f.value); problem != "" {
			return &FieldError{f.name, problem}
		}
	}
	return nil
}

// texts are the key's parts as the request names them.
func (k Key) texts() []textField {
	return []textField{
		{"key.project", k.Project, maxNameBytes}, {"key.domain", k.Domain, maxNameBytes},
		{"key.task_name", k.TaskName, maxTaskNameBytes}, {"key.cache_version", k.CacheVersion, maxKeyPartBytes},
		{"key.signature", k.Signature, maxKeyPartBytes}, {"key.inputs_hash", k.InputsHash, maxKeyPartBytes},
	}
}

func (k Key) check() error { return checkTexts(k.texts()...) }
