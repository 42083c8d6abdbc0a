#!/usr/bin/env bash
# llm-d's own endpoint picker beside warden's model of it (issue 47): starts
# warden emulate replicas on 127.0.0.1, runs llm-d's EPP in front of them
# with file discovery (no cluster) and its default profile (queue 2,
# kv-cache-utilization 2, prefix-cache 3, max-score picker), sends the same
# multi-turn agent sessions through it (scripts/llmdcompare plays the
# gateway), and prints how often warden's placement.NewPeer("llm-d") picks
# the replica the EPP picked, with the state at each strict disagreement.
#
#   LLMD_EPP=/path/to/epp scripts/llmd-compare.sh
#
# LLMD_EPP is an EPP binary ALREADY BUILT from llm-d/llm-d-router
# (cmd/epp); this repository never builds it. LLMD_EPP_COMMIT names the
# commit it was built from, for the report. Without LLMD_EPP the script
# says so and exits 0. Knobs: REPLICAS (4), SESSIONS (12), TURNS (10),
# SPEED (emulate --speed, 2), SEED (1), BLOCKS (the replicas'
# num_gpu_blocks, 1024: the EPP's per-replica LRU holds as many of its
# 64-token blocks), MAX_MODEL_LEN (16384), FLAGS (more llmdcompare flags,
# e.g. "-system-bytes 2000 -task-bytes 4000"), BASE_PORT (18400), OUT (a
# new temporary directory: the logs and run.json, the recorded run, which
# `go run ./scripts/llmdcompare -replay $OUT/run.json` compares again).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${LLMD_EPP:-}" ]; then
  echo "llmd-compare: skipped: set LLMD_EPP to an EPP binary built from llm-d/llm-d-router (its cmd/epp)"
  exit 0
fi
if [ ! -x "$LLMD_EPP" ]; then
  echo "llmd-compare: LLMD_EPP=$LLMD_EPP is not an executable file" >&2
  exit 1
fi
REPLICAS=${REPLICAS:-4}
SESSIONS=${SESSIONS:-12}
TURNS=${TURNS:-10}
SPEED=${SPEED:-2}
SEED=${SEED:-1}
BLOCKS=${BLOCKS:-1024}
MAX_MODEL_LEN=${MAX_MODEL_LEN:-16384}
BASE=${BASE_PORT:-18400}
OUT=${OUT:-$(mktemp -d)}
MODEL=Qwen/Qwen3-4B-Instruct-2507
GRPC=$((BASE + 90)) HEALTH=$((BASE + 91)) METRICS=$((BASE + 92))

go build -o "$OUT/warden" ./cmd/warden
go build -o "$OUT/llmdcompare" ./scripts/llmdcompare
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

# The farm: a small KV cache (BLOCKS blocks of 16 tokens) and 2 sequences a
# replica, so that the sessions leave queues and KV use for the scorers to see.
cat > "$OUT/farm.yaml" <<YAML
name: llmd-compare
model: $MODEL
gpu: RTX A4000
replicas: $REPLICAS
vllm: {max_num_seqs: 2, max_num_batched_tokens: 2048, block_size: 16, num_gpu_blocks: $BLOCKS, max_model_len: $MAX_MODEL_LEN}
YAML
"$OUT/warden" emulate --farm "$OUT/farm.yaml" --listen "127.0.0.1:$BASE" --speed "$SPEED" --seed "$SEED" \
  > "$OUT/emulate.log" 2>&1 &
pids+=($!)

addrs=() names=()
echo "endpoints:" > "$OUT/endpoints.yaml"
for ((k = 0; k < REPLICAS; k++)); do
  addrs+=("127.0.0.1:$((BASE + k))")
  names+=("r$k")
  printf '  - name: r%d\n    address: "127.0.0.1"\n    port: "%d"\n' "$k" $((BASE + k)) >> "$OUT/endpoints.yaml"
done
cat > "$OUT/epp.yaml" <<YAML
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- name: replicas
  type: file-discovery
  parameters:
    path: $OUT/endpoints.yaml
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
    weight: 2
  - pluginRef: kv-cache-utilization-scorer
    weight: 2
  - pluginRef: prefix-cache-scorer
    weight: 3
dataLayer:
  discovery:
    pluginRef: replicas
YAML
# -v=4: the per-scorer scores ("Calculated score") give the state the EPP
# read; --emit-endpoint-scores: the total scores come back with each pick;
# plaintext gRPC on the loopback (the gateway here speaks no TLS).
"$LLMD_EPP" --pool-name llmd-compare --pool-namespace local --config-file "$OUT/epp.yaml" \
  --grpc-port "$GRPC" --grpc-health-port "$HEALTH" --metrics-port "$METRICS" \
  --secure-serving=false --emit-endpoint-scores -v=4 > "$OUT/epp.log" 2>&1 &
epp=$!
pids+=($epp)
sleep 1
if ! kill -0 "$epp" 2>/dev/null; then
  echo "llmd-compare: the EPP exited; the end of $OUT/epp.log:" >&2
  tail -20 "$OUT/epp.log" >&2
  exit 1
fi

"$OUT/llmdcompare" -epp "127.0.0.1:$GRPC" -epp-health "127.0.0.1:$HEALTH" -epp-log "$OUT/epp.log" \
  -epp-commit "${LLMD_EPP_COMMIT:-unknown}" \
  -replicas "$(IFS=,; echo "${addrs[*]}")" -names "$(IFS=,; echo "${names[*]}")" \
  -model "$MODEL" -sessions "$SESSIONS" -turns "$TURNS" -seed "$SEED" -record "$OUT/run.json" ${FLAGS:-}
echo "(logs and the recorded run in $OUT)"
