// Package repo finds files of this repository from tests and tools, wherever they run.
package repo

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"sigs.k8s.io/yaml"
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

// ReadFile reads the file at elems joined onto the repository root.
func ReadFile(elems ...string) ([]byte, error) {
	path, err := Path(elems...)
	if err != nil {
		return nil, err
	}
	return os.ReadFile(path)
}

// ReadYAML decodes the YAML file at elems joined onto the repository root into v,
// refusing a field v does not have.
func ReadYAML(v any, elems ...string) error {
	raw, err := ReadFile(elems...)
	if err != nil {
		return err
	}
	if err := yaml.UnmarshalStrict(raw, v); err != nil {
		return fmt.Errorf("repo: %s: %w", filepath.Join(elems...), err)
	}
	return nil
}

// Build runs one of the repository's build scripts (hack/envtest.sh, hack/jaeger.sh
// build), its progress on stderr (a first build takes minutes), and returns the last line
// it printed: where what it built is.
func Build(script string, args ...string) (string, error) {
	path, err := Path("hack", script)
	if err != nil {
		return "", err
	}
	cmd := exec.Command(path, args...)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return lines[len(lines)-1], nil
}
