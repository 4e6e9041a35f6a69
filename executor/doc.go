// Package executor will hold the Kubernetes operator (not written yet) that runs TaskAction resources
// (flyte.org/v1) through plugins, reporting every phase change to the events service and
// consulting the cache service around cacheable tasks.
package executor
