//go:build tools

// Package tools records the main packages scripts/k8s-bins.sh builds, so that
// `go mod tidy` keeps their dependencies in go.mod/go.sum. The build tag keeps
// this file out of every normal build.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
