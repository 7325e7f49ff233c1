//go:build tools

// Package tools records the etcd main package scripts/k8s-bins.sh builds, so
// that `go mod tidy` keeps its dependencies in go.mod/go.sum. The build tag keeps
// this file out of every normal build.
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
)
