#!/usr/bin/env bash
# The demo (`make demo`): a loopback control plane, gpu-extender and kube-scheduler (the
# `gpu-scheduler` profile from scheduler-config/), a small heterogeneous GPU cluster of fake nodes,
# sample pods for every GPU mode; prints where each pod went and which GPUs it got (read from the
# allocation records on the pods), one sentence per pod on what it shows (checked against the
# placement: a pod placed otherwise fails the demo), then tears everything down. It builds what it
# needs itself, saying what and how long a first build takes.
#
# Usage: scripts/demo.sh
#   DEMO_HOLD=1   keep everything running until Enter is pressed (prints how to use kubectl)
#   DEMO_KEEP=1   keep the work directory (logs) after the end
# Needs: bash, curl, openssl (control plane), cargo (builds the extender), Go on the first run
# (scripts/k8s-bins.sh builds the Kubernetes binaries once, into ~/.cache/gpu-extender).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CP="$ROOT/scripts/control-plane.sh"
SCHED_CONFIG="$ROOT/scheduler-config/gpu-scheduler-profile.yaml"
SHIPPED_URL="http://127.0.0.1:8888/scheduler"
SHIPPED_KUBECONFIG="/etc/kubernetes/scheduler.conf"

log() { printf 'demo: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

for tool in curl openssl cargo; do
    command -v "$tool" >/dev/null || die "$tool is needed"
done

# --- build what is needed (here only: `make demo` builds nothing itself) ---------------------
log "Kubernetes binaries (kube-apiserver, kube-scheduler, kube-controller-manager, kubectl, etcd): built once from their Go"
log "  modules into ${GPU_TEST_CACHE:-$HOME/.cache/gpu-extender}/k8s; a first build takes about"
log "  8 minutes on 2 cores, afterwards this is a check of seconds"
BIN=$("$ROOT/scripts/k8s-bins.sh" | tail -n1)
export K8S_BIN_DIR=$BIN
K="$BIN/kubectl"
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
log "building gpu-extender (cargo build --release) into $TARGET"
log "  a first build takes several minutes on 2 cores, an unchanged one seconds"
# cargo's own "Blocking waiting for file lock" is easy to miss: say in plain words what we wait on.
(cd "$ROOT" && cargo build --locked --release --bin gpu-extender 2>&1) |
    while IFS= read -r line; do
        printf '%s\n' "$line" >&2
        if [[ "$line" == *"Blocking waiting for file lock"* ]]; then
            log "waiting for another cargo build that uses $TARGET to finish (it holds the lock)"
        fi
    done
EXTENDER="$TARGET/release/gpu-extender"
[[ -x "$EXTENDER" ]] || die "no extender binary at $EXTENDER"

# --- teardown, whatever happens -------------------------------------------------------------
WD=$(mktemp -d "${TMPDIR:-/tmp}/gpu-extender-demo.XXXXXX")
EXTENDER_PID=
OK=0
cleanup() {
    local rc=$? i
    if [[ -n "$EXTENDER_PID" ]] && kill -0 "$EXTENDER_PID" 2>/dev/null; then
        kill -TERM "$EXTENDER_PID" 2>/dev/null || true
        for ((i = 0; i < 100; i++)); do
            kill -0 "$EXTENDER_PID" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL "$EXTENDER_PID" 2>/dev/null || true
    fi
    "$CP" stop "$WD" || true
    if [[ $OK != 1 ]]; then
        log "FAILED (exit $rc); log tails:"
        local f
        for f in extender.log kube-scheduler.log kube-apiserver.log; do
            [[ -f "$WD/$f" ]] || continue
            printf -- '----- %s\n' "$WD/$f" >&2
            tail -n 20 "$WD/$f" >&2
        done
    fi
    if [[ "${DEMO_KEEP:-0}" == 1 ]]; then
        log "kept $WD"
    else
        rm -rf "$WD"
    fi
    log "everything stopped"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# A loopback port nobody listens on (20000-32767: below the ephemeral range).
free_port() {
    local p i
    for ((i = 0; i < 200; i++)); do
        p=$((20000 + (RANDOM * 32768 + RANDOM) % 12768))
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
            printf '%s\n' "$p"
            return 0
        fi
    done
    die "no free port"
}

# --- control plane, extender, scheduler -----------------------------------------------------
T0=$SECONDS
"$CP" start "$WD"
eval "$("$CP" env "$WD")"

PORT=$(free_port)
ADMIN_PORT=$(free_port)
while [[ "$ADMIN_PORT" == "$PORT" ]]; do ADMIN_PORT=$(free_port); done
# Every key at its default (docs/configuration.md), but /inspect open: the demo's extender is
# on loopback and its report is read with curl below (server.adminAuth guards it by default).
printf 'server:\n  adminAuth:\n    paths: []\n' >"$WD/extender.yaml"
log "starting gpu-extender on 127.0.0.1:$PORT (admin 127.0.0.1:$ADMIN_PORT)"
env -u GPU_TEST_CACHE RUST_LOG="${RUST_LOG:-info}" "$EXTENDER" serve \
    --config "$WD/extender.yaml" --kubeconfig "$KUBECONFIG" \
    --listen "127.0.0.1:$PORT" --admin-listen "127.0.0.1:$ADMIN_PORT" \
    </dev/null >"$WD/extender.log" 2>&1 &
EXTENDER_PID=$!
deadline=$((SECONDS + 60))
until [[ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 \
    "http://127.0.0.1:$ADMIN_PORT/readyz" 2>/dev/null || true)" == 200 ]]; do
    kill -0 "$EXTENDER_PID" 2>/dev/null || die "gpu-extender exited (see its log above)"
    ((SECONDS < deadline)) || die "gpu-extender not ready within 60s"
    sleep 0.2
done

config=$(<"$SCHED_CONFIG")
config=${config//"$SHIPPED_URL"/"http://127.0.0.1:$PORT/scheduler"}
config=${config//"$SHIPPED_KUBECONFIG"/__KUBECONFIG__}
printf '%s\n' "$config" >"$WD/gpu-scheduler-profile.yaml"
"$CP" scheduler "$WD" "$WD/gpu-scheduler-profile.yaml"
log "control plane, gpu-extender and kube-scheduler up in $((SECONDS - T0))s"

# --- the GPU nodes ----------------------------------------------------------------------------
# Per-GPU detail for the NVLink node: two islands of 4 GPUs (NV12 inside, SYS across).
nvlink_annotation() {
    local i j gpus="" links="" row
    for ((i = 0; i < 8; i++)); do
        gpus+="${gpus:+,}{\"index\":$i,\"uuid\":\"GPU-demo-a100-$i\",\"model\":\"NVIDIA-A100-SXM4-80GB\",\"memoryMiB\":81920,\"numa\":$((i / 4)),\"healthy\":true}"
        row=""
        for ((j = 0; j < 8; j++)); do
            if ((i == j)); then row+="${row:+,}\"X\""
            elif ((i / 4 == j / 4)); then row+="${row:+,}\"NV12\""
            else row+="${row:+,}\"SYS\""; fi
        done
        links+="${links:+,}[$row]"
    done
    printf '{"version":1,"gpus":[%s],"links":[%s]}' "$gpus" "$links"
}

# make_node NAME MODE(default|cgpu|core_mem|topology) PLACEMENT MODEL MEM_GIB COUNT [ANNOTATION]
make_node() {
    local name=$1 mode=$2 placement=$3 model=$4 mem=$5 count=$6 detail=${7:-} res
    {
        printf 'apiVersion: v1\nkind: Node\nmetadata:\n  name: %s\n  labels:\n' "$name"
        printf '    kubernetes.io/hostname: %s\n' "$name"
        [[ "$mode" == default ]] || printf '    ack.node.gpu.schedule: %s\n' "$mode"
        [[ -z "$placement" ]] || printf '    ack.node.gpu.placement: %s\n' "$placement"
        printf '    aliyun.accelerator/nvidia_name: %s\n' "$model"
        printf '    aliyun.accelerator/nvidia_mem: "%sMiB"\n' "$((mem * 1024))"
        printf '    aliyun.accelerator/nvidia_count: "%s"\n' "$count"
        if [[ -n "$detail" ]]; then
            printf "  annotations:\n    gpu-extender.io/gpus: '%s'\n" "$detail"
        fi
    } | "$K" create -f - >/dev/null
    # What the device plugin would advertise for the mode.
    case $mode in
        default) res="\"nvidia.com/gpu\": \"$count\"" ;;
        topology) res="\"aliyun.com/gpu\": \"$count\"" ;;
        cgpu) res="\"aliyun.com/gpu-mem\": \"$((mem * count))\", \"aliyun.com/gpu-count\": \"$count\"" ;;
        core_mem) res="\"aliyun.com/gpu-mem\": \"$((mem * count))\", \"aliyun.com/gpu-count\": \"$count\", \"aliyun.com/gpu-core.percentage\": \"$((100 * count))\"" ;;
    esac
    local cap="{\"cpu\": \"64\", \"memory\": \"256Gi\", \"pods\": \"110\", $res}"
    "$K" patch node "$name" --subresource=status --type=merge -p "{\"status\": {
        \"capacity\": $cap, \"allocatable\": $cap,
        \"conditions\": [{\"type\": \"Ready\", \"status\": \"True\", \"reason\": \"KubeletReady\",
                          \"message\": \"fake node (no kubelet)\"}]}}" >/dev/null
    printf '  %-16s %-9s %-8s %d x %s (%d GiB)\n' "$name" "$mode" "${placement:--}" "$count" "$model" "$mem"
}

log "creating the GPU nodes"
printf '  %-16s %-9s %-8s %s\n' NODE MODE PLACE GPUS
make_node a100-nvlink topology "" NVIDIA-A100-SXM4-80GB 80 8 "$(nvlink_annotation)"
make_node t4-binpack cgpu binpack Tesla-T4 16 4
make_node a10-spread cgpu spread NVIDIA-A10 24 4
make_node v100-coremem core_mem "" Tesla-V100-SXM2-32GB 32 2
make_node a100-whole default "" NVIDIA-A100-PCIE-40GB 40 1

# --- the pods ---------------------------------------------------------------------------------
# make_pod NAME 'RESOURCES (json fields)' [extra metadata yaml] [extra spec yaml]
PODS=()
make_pod() {
    local name=$1 res=$2 meta=${3:-} spec=${4:-}
    PODS+=("$name")
    "$K" create -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: $name
  labels:
    app: gpu-demo
$meta
spec:
  schedulerName: gpu-scheduler
  terminationGracePeriodSeconds: 0
$spec
  containers:
  - name: main
    image: registry.k8s.io/pause:3.10
    resources:
      limits: {cpu: 100m, memory: 64Mi, $res}
EOF
}
on_model() { printf '  nodeSelector: {aliyun.accelerator/nvidia_name: %s}' "$1"; }

# What each sample pod shows: one sentence each, printed after the table only when the placement
# makes it true (`shows` checks it; anything else fails the demo with what happened instead).
declare -A SAYS=(
    [train-4gpu]="4 whole GPUs that form one NVLink island of a100-nvlink (GPUs 0-3, NV12 inside), keeping the other island intact"
    [train-2gpu]="2 whole GPUs from the second NVLink island (GPUs 4-7): the first is taken by train-4gpu"
    [infer-a]="binpack: a 4 GiB share of the first T4"
    [infer-b]="binpack: the same T4 as infer-a rather than an empty one"
    [infer-c]="binpack: 8 GiB more fills that T4 (16 of 16 GiB)"
    [notebook]="binpack: 6 GiB no longer fits the full T4, so it opens the next one"
    [svc-1]="spread: a 4 GiB share on an A10"
    [svc-2]="spread: a different A10 from svc-1's"
    [svc-3]="spread: a third A10, neither svc-1's nor svc-2's"
    [split-8g]="the pod label aliyun.com/gpu-count: 2 splits its 8 GiB into 4 GiB on each of two A10s"
    [cm-half]="core_mem: 8 GiB and 50% of the compute of a V100"
    [cm-third]="binpack on core_mem: the same V100 as cm-half, 30% more of its compute (80% in all)"
    [batch-1]="an exclusive pod: the only GPU of a100-whole, whole"
    [batch-2]="pending: the cluster's only whole nvidia.com/gpu is taken by batch-1"
    [pick-a10]="the annotation gpu-extender.io/model-include: NVIDIA-A10 puts it on an A10 without a node selector"
    [bad-split]="refused with the reason: 15 GiB cannot be split evenly over 2 GPUs"
)

log "submitting sample pods"
# topology: whole GPUs chosen by NVLink; a 4-GPU pod gets one island, the 2-GPU pod the other.
make_pod train-4gpu '"aliyun.com/gpu": "4"'
make_pod train-2gpu '"aliyun.com/gpu": "2"'
# cgpu, binpack: shares fill one T4 before the next.
for p in infer-a:4 infer-b:4 infer-c:8 notebook:6; do
    make_pod "${p%%:*}" "\"aliyun.com/gpu-mem\": \"${p##*:}\"" "" "$(on_model Tesla-T4)"
done
# cgpu, spread: shares spread over the A10s; one pod split over 2 GPUs (label gpu-count).
for p in svc-1 svc-2 svc-3; do
    make_pod "$p" '"aliyun.com/gpu-mem": "4"' "" "$(on_model NVIDIA-A10)"
done
make_pod split-8g '"aliyun.com/gpu-mem": "8"' "    aliyun.com/gpu-count: \"2\"" "$(on_model NVIDIA-A10)"
# core_mem: memory and a percentage of compute.
make_pod cm-half '"aliyun.com/gpu-mem": "8", "aliyun.com/gpu-core.percentage": "50"'
make_pod cm-third '"aliyun.com/gpu-mem": "8", "aliyun.com/gpu-core.percentage": "30"'
# exclusive: one whole GPU; a second pod has to wait.
make_pod batch-1 '"nvidia.com/gpu": "1"'
make_pod batch-2 '"nvidia.com/gpu": "1"'
# Card model by annotation; and a malformed request.
make_pod pick-a10 '"aliyun.com/gpu-mem": "2"' "  annotations: {gpu-extender.io/model-include: NVIDIA-A10}"
make_pod bad-split '"aliyun.com/gpu-mem": "15"' "    aliyun.com/gpu-count: \"2\""

# --- wait until every pod is bound or unschedulable ------------------------------------------
jp='{range .items[*]}{.metadata.name}{"\t"}{.spec.nodeName}{"\t"}{.status.conditions[?(@.type=="PodScheduled")].reason}{"\n"}{end}'
deadline=$((SECONDS + 60))
while :; do
    waiting=$("$K" get pods -l app=gpu-demo -o jsonpath="$jp" |
        awk -F'\t' '$2 == "" && $3 != "Unschedulable"' | wc -l)
    ((waiting == 0)) && break
    ((SECONDS < deadline)) || die "$waiting pods neither bound nor unschedulable after 60s"
    sleep 0.3
done

# --- the table --------------------------------------------------------------------------------
# The allocation record (docs/annotations.md) is compact JSON: list each GPU entry of the app
# containers as index:amount.
gpus_of() {
    local record=$1 out="" entry idx amt mem milli
    record=${record%%\"initContainers\"*}
    while [[ "$record" =~ \{\"index\":([0-9]+)([^}]*)\} ]]; do
        entry=${BASH_REMATCH[0]}
        idx=${BASH_REMATCH[1]}
        amt=whole
        if [[ "$entry" =~ \"memoryMiB\":([0-9]+) ]]; then
            mem=${BASH_REMATCH[1]}
            amt="$((mem / 1024))GiB"
            if [[ "$entry" =~ \"computeMilli\":([0-9]+) ]]; then
                milli=${BASH_REMATCH[1]}
                amt+="/$((milli / 10))%"
            fi
        fi
        out+="${out:+ }gpu$idx:$amt"
        record=${record#*"$entry"}
    done
    printf '%s' "${out:--}"
}

declare -A NODE_OF GPUS_OF
printf '\n%-12s %-14s %-30s %s\n' POD NODE GPUS "(from the allocation record) / why not scheduled"
for pod in "${PODS[@]}"; do
    node=$("$K" get pod "$pod" -o jsonpath='{.spec.nodeName}')
    if [[ -n "$node" ]]; then
        record=$("$K" get pod "$pod" -o jsonpath='{.metadata.annotations.gpu-extender\.io/allocation}')
        NODE_OF[$pod]=$node GPUS_OF[$pod]=$(gpus_of "$record")
    else
        why=$("$K" get pod "$pod" -o jsonpath='{.status.conditions[?(@.type=="PodScheduled")].message}')
        why=${why%%. no new claims*} why=${why%%. preemption:*}
        NODE_OF[$pod]="(pending)" GPUS_OF[$pod]=$why
    fi
    printf '%-12s %-14s %s\n' "$pod" "${NODE_OF[$pod]}" "${GPUS_OF[$pod]}"
done

# on POD NODE REGEX: POD is on NODE and its GPUs match REGEX in full.
on() { [[ "${NODE_OF[$1]}" == "$2" && "${GPUS_OF[$1]}" =~ ^($3)$ ]]; }
# shows POD: the placement makes POD's sentence true.
shows() {
    local g=${GPUS_OF[$1]}
    case $1 in
        train-4gpu) on "$1" a100-nvlink '(gpu[0-3]:whole ?){4}' ;;
        train-2gpu) on "$1" a100-nvlink '(gpu[4-7]:whole ?){2}' ;;
        infer-a | infer-b) on "$1" t4-binpack 'gpu0:4GiB' ;;
        infer-c) on "$1" t4-binpack 'gpu0:8GiB' ;;
        notebook) on "$1" t4-binpack 'gpu1:6GiB' ;;
        svc-1) on "$1" a10-spread 'gpu[0-3]:4GiB' ;;
        svc-2) on "$1" a10-spread 'gpu[0-3]:4GiB' && [[ $g != "${GPUS_OF[svc-1]}" ]] ;;
        svc-3) on "$1" a10-spread 'gpu[0-3]:4GiB' &&
            [[ $g != "${GPUS_OF[svc-1]}" && $g != "${GPUS_OF[svc-2]}" ]] ;;
        split-8g) on "$1" a10-spread 'gpu[0-3]:4GiB gpu[0-3]:4GiB' && [[ ${g%% *} != "${g#* }" ]] ;;
        cm-half) on "$1" v100-coremem 'gpu[01]:8GiB/50%' ;;
        cm-third) on "$1" v100-coremem "${GPUS_OF[cm-half]%%:*}:8GiB/30%" ;;
        batch-1) on "$1" a100-whole 'gpu0:whole' ;;
        batch-2) [[ "${NODE_OF[$1]}" == "(pending)" && $g == *"Insufficient nvidia.com/gpu"* ]] ;;
        pick-a10) on "$1" a10-spread 'gpu[0-3]:2GiB' ;;
        bad-split) [[ "${NODE_OF[$1]}" == "(pending)" && $g == *"cannot be split evenly over 2 GPUs"* ]] ;;
        *) false ;;
    esac
}
printf '\nWhat each pod shows:\n'
UNTRUE=()
for pod in "${PODS[@]}"; do
    if shows "$pod"; then
        printf '  %-11s %s\n' "$pod:" "${SAYS[$pod]}"
    else
        printf '  %-11s NOT AS EXPECTED: meant to show that %s; got %s %s\n' "$pod:" \
            "${SAYS[$pod]:-(no sentence)}" "${NODE_OF[$pod]}" "${GPUS_OF[$pod]}"
        UNTRUE+=("$pod")
    fi
done
# Per node and GPU, what the extender's table holds (its /inspect report, like
# `kubectl inspect cgpu`): memory allocated/total, compute, and the pods on each GPU.
printf '\n%-14s %-18s %s\n' NODE MODE "GPU: allocated/total memory (compute) pods   (the extender's /inspect)"
gpu_re='"index":([0-9]+),"uuid":[^,]*,"model":"[^"]*","healthy":([a-z]+),"memoryMib":([0-9]+),"memoryAllocatedMib":([0-9]+),"computeAllocatedMilli":([0-9]+),"whole":([a-z]+),"pods":\[([^]]*)\]'
curl -s --max-time 5 "http://127.0.0.1:$ADMIN_PORT/inspect" | sed 's/{"name":"/\n&/g' |
    while IFS= read -r line || [[ -n "$line" ]]; do
        [[ "$line" =~ ^\{\"name\":\"([^\"]+)\",\"mode\":\"([^\"]+)\",\"placement\":\"([^\"]+)\" ]] || continue
        node=${BASH_REMATCH[1]} mode="${BASH_REMATCH[2]}/${BASH_REMATCH[3]}"
        first=1
        while [[ "$line" =~ $gpu_re ]]; do
            idx=${BASH_REMATCH[1]} healthy=${BASH_REMATCH[2]} total=${BASH_REMATCH[3]}
            used=${BASH_REMATCH[4]} milli=${BASH_REMATCH[5]} whole=${BASH_REMATCH[6]}
            holders=${BASH_REMATCH[7]//\"/} holders=${holders//default\//}
            if [[ $whole == true ]]; then
                use="whole"
            else
                use="$((used / 1024))/$((total / 1024))GiB"
                ((milli == 0)) || use+=" ($((milli / 10))%)"
            fi
            [[ $healthy == true ]] || use+=" UNHEALTHY"
            printf '%-14s %-18s gpu%-2s %-16s %s\n' "${first:+$node}" "${first:+$mode}" \
                "$idx" "$use" "${holders//,/ }"
            first=
            line=${line#*"${BASH_REMATCH[0]}"}
        done
    done
echo

if [[ "${DEMO_HOLD:-0}" == 1 ]]; then
    cat <<EOF

Everything is still running. In another shell:
  export KUBECONFIG=$KUBECONFIG
  $K get pods -o wide
  curl -s http://127.0.0.1:$ADMIN_PORT/inspect
  curl -s http://127.0.0.1:$ADMIN_PORT/metrics | grep ^gpu_extender_
Press Enter to tear down.
EOF
    read -r _ || true
fi
((${#UNTRUE[@]} == 0)) || die "placed otherwise than the demo says: ${UNTRUE[*]}"
OK=1
log "done in $((SECONDS - T0))s; tearing down"
