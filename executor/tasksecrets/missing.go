package tasksecrets

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"

	flytev1 "github.com/flytekube/backend/executor/api/v1"
)

// What the kubelet says when a Secret a pod refers to, or a key of it, does not exist:
// in a container's waiting message (reason CreateContainerConfigError) for an
// environment variable, in a FailedMount event for a volume. Neither goes away unless
// someone creates the Secret, so waiting for it would last forever.
var (
	// secret "db" not found (the API's NotFound error, in both places)
	secretNotFound = regexp.MustCompile(`secrets? "([^"]+)" not found`)
	// couldn't find key password in Secret ns/db (environment variables)
	keyNotFound = regexp.MustCompile(`(?i)couldn't find key (\S+) in Secret [^/\s]+/(\S+)`)
	// MountVolume.SetUp failed for volume "flyte-secret-1" : references non-existent secret key: password
	volumeKeyNotFound = regexp.MustCompile(`volume "([^"]+)".*references non-existent secret key: (\S+)`)
)

// Missing reads a kubelet message and, when it says a Secret or a key of one does not
// exist, describes what is missing and which entries of secrets ask for it, such as
// `Secret "db" key "password" does not exist (spec.secrets[0], env DB_PASSWORD)`.
func Missing(secrets []flytev1.TaskSecret, message string) (string, bool) {
	name, key := "", ""
	if m := keyNotFound.FindStringSubmatch(message); m != nil {
		key, name = m[1], m[2]
	} else if m := volumeKeyNotFound.FindStringSubmatch(message); m != nil {
		key = m[2]
		// The message names the volume, not the Secret: the volume's name says which entry.
		if i, ok := volumeIndex(m[1]); ok && i < len(secrets) {
			name = secrets[i].Name
		}
	} else if m := secretNotFound.FindStringSubmatch(message); m != nil {
		name = m[1]
	} else {
		return "", false
	}
	var what string
	switch {
	case name != "" && key != "":
		what = fmt.Sprintf("Secret %q key %q does not exist", name, key)
	case key != "":
		what = fmt.Sprintf("key %q of a Secret does not exist", key)
	default:
		what = fmt.Sprintf("Secret %q does not exist", name)
	}
	var refs []string
	for i, s := range secrets {
		if s.Name != name || key != "" && s.Key != key {
			continue
		}
		ref := fmt.Sprintf("spec.secrets[%d], ", i)
		if s.Env != "" {
			ref += "env " + s.Env
		} else {
			ref += "mountPath " + s.MountPath
		}
		refs = append(refs, ref)
	}
	if len(refs) > 0 {
		what += " (" + strings.Join(refs, "; ") + ")"
	}
	return what, true
}

// volumeIndex is the index of spec.secrets that VolumeName named volume.
func volumeIndex(volume string) (int, bool) {
	rest, ok := strings.CutPrefix(volume, volumePrefix)
	if !ok {
		return 0, false
	}
	i, err := strconv.Atoi(rest)
	return i, err == nil && i >= 0
}
