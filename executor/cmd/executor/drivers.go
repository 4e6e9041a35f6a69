package main

// The blob drivers the executor's data store supports beyond file:// and mem://.
import (
	_ "gocloud.dev/blob/gcsblob" // gs:// URIs
	_ "gocloud.dev/blob/s3blob"  // s3:// URIs
)
