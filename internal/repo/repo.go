// Package repo finds files of this repository from tests and tools, wherever they run.
package repo

import (
	"errors"
	"os"
	"path/filepath"
)

// Root returns the repository root: the nearest directory above the working directory
// holding go.mod.
func Root() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("repo: no go.mod above the working directory")
		}
		dir = parent
	}
}

// Path joins elems onto the repository root.
func Path(elems ...string) (string, error) {
	root, err := Root()
	if err != nil {
		return "", err
	}
	return filepath.Join(append([]string{root}, elems...)...), nil
}
