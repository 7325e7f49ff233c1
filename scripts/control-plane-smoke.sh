#!/usr/bin/env bash
# Smoke test of the real control-plane tooling (no extender involved):
#   build/reuse the binaries, start etcd + kube-apiserver in a temp dir, create a fake
#   GPU Node (status set through the status subresource), run the default kube-scheduler
#   (plain KubeSchedulerConfiguration, no extenders) and check that it binds pods to the
#   node, respects nvidia.com/gpu capacity, and survives a scheduler-stop/restart; then
#   stop everything and check nothing is left running.
#
# Usage: scripts/control-plane-smoke.sh      (CP_SMOKE_KEEP=1 keeps the temp dir)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CP="$ROOT/scripts/control-plane.sh"

log() { printf 'smoke: %s\n' "$*" >&2; }
T0=$SECONDS

BIN=$("$ROOT/scripts/k8s-bins.sh" | tail -n1)
log "binaries ready in $((SECONDS - T0))s: $BIN"
export K8S_BIN_DIR=$BIN
K="$BIN/kubectl"

WD=$(mktemp -d "${TMPDIR:-/tmp}/gpu-extender-cp-smoke.XXXXXX")
OK=0
cleanup() {
    local rc=$?
    "$CP" stop "$WD" || true
    if [[ $OK != 1 ]]; then
        log "FAILED (rc $rc); log tails from $WD:"
        local f
        for f in "$WD"/etcd.log "$WD"/kube-apiserver.log "$WD"/kube-scheduler.log; do
            [[ -f "$f" ]] || continue
            printf -- '--- %s\n' "$f" >&2
            tail -n 25 "$f" >&2
        done
    fi
    if [[ "${CP_SMOKE_KEEP:-0}" == 1 ]]; then
        log "kept $WD"
    else
        rm -rf "$WD"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

T1=$SECONDS
"$CP" start "$WD"
log "control plane up in $((SECONDS - T1))s"
eval "$("$CP" env "$WD")"

# --- a fake GPU node: the object, then its status via the status subresource ---
"$K" create -f - <<'EOF'
apiVersion: v1
kind: Node
metadata:
  name: gpu-node-1
  labels:
    kubernetes.io/hostname: gpu-node-1
EOF
now=$(date -u +%FT%TZ)
"$K" patch node gpu-node-1 --subresource=status --type=merge -p "$(cat <<EOF
{"status": {
  "capacity":    {"cpu": "8", "memory": "32Gi", "pods": "110", "nvidia.com/gpu": "8"},
  "allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110", "nvidia.com/gpu": "8"},
  "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                  "message": "fake node (no kubelet)",
                  "lastHeartbeatTime": "$now", "lastTransitionTime": "$now"}]
}}
EOF
)"
alloc=$("$K" get node gpu-node-1 -o jsonpath='{.status.allocatable.nvidia\.com/gpu}')
[[ "$alloc" == 8 ]] || { log "node allocatable nvidia.com/gpu is '$alloc', want 8"; exit 1; }

# --- the default scheduler, no extenders ---
cat >"$WD/smoke-scheduler.yaml" <<'EOF'
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: __KUBECONFIG__
leaderElection:
  leaderElect: false
EOF
T2=$SECONDS
"$CP" scheduler "$WD" "$WD/smoke-scheduler.yaml"
log "kube-scheduler up in $((SECONDS - T2))s"

pod() { # <name> [gpus]
    local res=""
    [[ -n "${2:-}" ]] && res=$'\n'"      limits: {nvidia.com/gpu: \"$2\"}"
    "$K" create -f - <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: $1
spec:
  containers:
  - name: main
    image: registry.k8s.io/pause:3.10
    resources:
      requests: {cpu: 100m, memory: 64Mi}$res
EOF
}

wait_bound() { # <pod> -> waits until spec.nodeName is gpu-node-1
    local node="" deadline=$((SECONDS + 60))
    while ((SECONDS < deadline)); do
        node=$("$K" get pod "$1" -o jsonpath='{.spec.nodeName}')
        if [[ -n "$node" ]]; then
            [[ "$node" == gpu-node-1 ]] || { log "pod $1 bound to '$node'"; return 1; }
            log "pod $1 bound to $node"
            return 0
        fi
        sleep 0.2
    done
    log "pod $1 not bound after 60s"
    "$K" describe pod "$1" >&2 || true
    return 1
}

T3=$SECONDS
pod plain
wait_bound plain
log "plain pod bound in $((SECONDS - T3))s"

pod gpu-two 2
wait_bound gpu-two

# Nine GPUs do not fit on an 8-GPU node: must stay unscheduled.
pod gpu-nine 9
deadline=$((SECONDS + 30))
until "$K" get events --field-selector involvedObject.name=gpu-nine,reason=FailedScheduling \
    -o jsonpath='{.items[*].message}' | grep -q 'Insufficient nvidia.com/gpu'; do
    ((SECONDS < deadline)) || { log "no 'Insufficient nvidia.com/gpu' event for gpu-nine"; exit 1; }
    sleep 0.5
done
[[ -z "$("$K" get pod gpu-nine -o jsonpath='{.spec.nodeName}')" ]] || { log "gpu-nine was bound"; exit 1; }
log "pod gpu-nine unschedulable (Insufficient nvidia.com/gpu), as expected"

# --- the scheduler can be stopped and restarted alone ---
"$CP" scheduler-stop "$WD"
pod after-restart
sleep 1
[[ -z "$("$K" get pod after-restart -o jsonpath='{.spec.nodeName}')" ]] || { log "bound with no scheduler?"; exit 1; }
"$CP" scheduler "$WD" "$WD/smoke-scheduler.yaml"
wait_bound after-restart

# Bound pods never run (no kubelet): delete them at once.
"$K" delete pod --all --grace-period=0 --force --wait=false >/dev/null 2>&1

# --- stop, and make sure nothing is left ---
pids=$(cat "$WD"/*.pid 2>/dev/null || true)
"$CP" stop "$WD"
"$CP" stop "$WD" # idempotent
for p in $pids; do
    state=$(ps -o stat= -p "$p" 2>/dev/null || true)
    if [[ -n "$state" && "$state" != Z* ]]; then log "process $p still running after stop"; exit 1; fi
done
[[ -z "$(ls "$WD"/*.pid 2>/dev/null)" ]] || { log "pid files left behind"; exit 1; }

OK=1
log "PASS in $((SECONDS - T0))s (control plane start $((T2 - T1))s)"
