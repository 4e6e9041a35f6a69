package k8s

import (
	"testing"
	"time"
)

func TestOverHardLimit(t *testing.T) {
	tests := []struct {
		msg, want string
	}{
		{`pods "r1-a0-1" is forbidden: exceeded quota: compute, requested: limits.cpu=2,requests.cpu=2, used: requests.cpu=0, limited: requests.cpu=1`, "requests.cpu"},
		{`pods "r1-a0-1" is forbidden: exceeded quota: compute, requested: requests.cpu=500m, used: requests.cpu=800m, limited: requests.cpu=1`, ""},
		{`pods "r1-a0-1" is forbidden: exceeded quota: pods, requested: pods=1, used: pods=1, limited: pods=1`, ""},
		{`pods "x" is forbidden: exceeded quota: mem, requested: requests.memory=4Gi, used: requests.memory=0, limited: requests.memory=2Gi`, "requests.memory"},
		{`forbidden: something else entirely`, ""},
	}
	for _, tt := range tests {
		if got := overHardLimit(tt.msg); got != tt.want {
			t.Errorf("overHardLimit(%q) = %q; want %q", tt.msg, got, tt.want)
		}
	}
}

func TestQuotaWaitGrowsAndIsCapped(t *testing.T) {
	prev := time.Duration(0)
	for n := 1; n <= 12; n++ {
		d := quotaWait(n)
		upper := min(quotaWaitBase<<(n-1), quotaWaitCap)
		if n >= 8 {
			upper = quotaWaitCap
		}
		if d < upper/2 || d > upper {
			t.Fatalf("quotaWait(%d) = %s; want within [%s, %s]", n, d, upper/2, upper)
		}
		if n <= 6 && upper/2 < prev/2 {
			t.Fatalf("the wait shrank at %d", n)
		}
		prev = upper
	}
}
