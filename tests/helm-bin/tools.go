//go:build tools

// Package tools records the helm main package scripts/helm.sh builds, so that
// `go mod tidy` keeps its dependencies in go.mod/go.sum. The build tag keeps
// this file out of every normal build.
package tools

import (
	_ "helm.sh/helm/v3/cmd/helm"
)
