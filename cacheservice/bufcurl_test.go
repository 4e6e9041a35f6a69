package cacheservice_test

import (
	"strings"
	"testing"

	"github.com/flytekube/backend/cacheservice"
	"github.com/flytekube/backend/test/servicetest"
)

// TestBufCurlCallsEveryRPC runs the buf curl commands of docs/cacheservice.md against a
// running service: reflection alone must be enough to call every RPC.
func TestBufCurlCallsEveryRPC(t *testing.T) {
	// As the cookbook shows it: TLS, and an executor's token (a viewer could not write).
	pki, tokens := servicetest.NewPKI(t), servicetest.NewTokens(t)
	inst := startInstance(t, pg.NewDatabase(t), func(c *cacheservice.Config) { c.Server, c.Auth = pki.ServerConfig(), tokens.AuthConfig() })
	inst.UseTLS(pki, tokens.Executor)
	base := inst.URL + "/flyte.cache.v1.CacheService/"
	const key = `{"project":"demo","domain":"development","taskName":"demo.train","cacheVersion":"1","signature":"sig1","inputsHash":"inputs-a"}`
	src := `{"project":"demo","domain":"development","run":"r1","action":"a0"}`

	steps := []struct{ rpc, body, want string }{
		{"Put", `{"key":` + key + `,"outputUri":"s3://bucket/r1/a0/outputs","sourceAction":` + src + `,"sourceAttempt":1}`, `"outputUri": "s3://bucket/r1/a0/outputs"`},
		{"Get", `{"key":` + key + `}`, `"sourceAttempt": 1`},
		{"GetOrExtendReservation", `{"key":` + key + `,"ownerId":"r1-a0-1","heartbeatInterval":"5s"}`, `"acquired": true`},
		{"ReleaseReservation", `{"key":` + key + `,"ownerId":"r1-a0-1"}`, `"released": true`},
		{"LookupOrReserve", `{"key":` + key + `,"ownerId":"r1-a0-1","heartbeatInterval":"5s"}`, `"outputUri": "s3://bucket/r1/a0/outputs"`},
		{"LookupOrReserve", `{"key":` + key + `,"ownerId":"r1-a0-1","heartbeatInterval":"5s","action":` + src + `,"skipLookup":true}`, `"acquired": true`},
		{"PutAndRelease", `{"put":{"key":` + key + `,"outputUri":"s3://bucket/r1/a0/outputs","sourceAction":` + src + `,"sourceAttempt":1,"overwrite":true,"outputBytes":"1024"},"ownerId":"r1-a0-1"}`, `"released": true`},
		{"Delete", `{"key":` + key + `}`, `"deleted": true`},
		{"Invalidate", `{"project":"demo","domain":"development","taskName":"demo.train"}`, `{`},
	}
	if out := inst.BufCurl(t, "--list-methods", inst.URL); !strings.Contains(out, "flyte.cache.v1.CacheService/GetOrExtendReservation") {
		t.Fatalf("--list-methods:\n%s", out)
	}
	for _, s := range steps {
		if out := inst.BufCurl(t, "-d", s.body, base+s.rpc); !strings.Contains(out, s.want) {
			t.Fatalf("%s printed:\n%s\nwant it to contain %s", s.rpc, out, s.want)
		}
	}
}
