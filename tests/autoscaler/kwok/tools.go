//go:build tools

// Test tooling only: pins kwok, the fake kubelet that makes the nodes the test
// autoscaler adds Ready and the pods bound to them Running, for the autoscaling
// end-to-end scenarios. scripts/autoscaler-bins.sh builds sigs.k8s.io/kwok/cmd/kwok
// from this module. Nothing here is linked into gpu-extender.
package tools

import _ "sigs.k8s.io/kwok/cmd/kwok"
