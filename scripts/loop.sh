#!/usr/bin/env bash
# The whole loop on one machine, no GPU: an emulated 4 x RTX A4000 farm
# (warden emulate --layout dp: one vLLM server of 4 data-parallel ranks,
# with vLLM's own front end as the farm's release runs it), benched first
# straight, through vLLM's own balancer (what warden sim calls least-loaded),
# then through warden proxy with affinity on (a fresh farm for each, as
# warden sim runs each strategy on a cold farm); warden sim with the same
# seed and load, and warden compare. The farm must have 4 replicas.
#
#   scripts/loop.sh            # steps of 4 and 8 sessions, 3 minutes each, 20x faster (~1 minute)
#   SHORT=1 scripts/loop.sh    # the short form make test runs (2 sessions, 40 s steps)
#   FARM=sim/testdata/validation/farm.yaml WORKLOAD=sim/testdata/validation/workload.yaml scripts/loop.sh
#                              # another farm spec and workload YAML (emulate, bench and sim alike)
#
# Outputs go to $OUT (default: a new temporary directory): sim.json,
# off.json, on.json and compare.html, and each run's requests
# (sim.requests.jsonl, off.requests.jsonl, on.requests.jsonl).
set -euo pipefail
cd "$(dirname "$0")/.."
SPEED=${SPEED:-20}
if [ -n "${SHORT:-}" ]; then SESSIONS=2; STEP=40s; else SESSIONS=4,8; STEP=3m; fi
OUT=${OUT:-$(mktemp -d)}
BASE=${BASE_PORT:-18000}
warden=$OUT/warden
farm=() workload=()
if [ -n "${FARM:-}" ]; then farm=(--farm "$FARM"); fi
if [ -n "${WORKLOAD:-}" ]; then workload=(--workload "$WORKLOAD"); fi

go build -o "$warden" ./cmd/warden
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

server=http://127.0.0.1:$BASE
# wait_up URL PID LOG: until URL answers; if the process PID ends first (a
# port already in use, say) or 10 s pass, the end of its LOG says why.
wait_up() {
  for _ in $(seq 100); do
    curl -sf "$1" >/dev/null && return 0
    if ! kill -0 "$2" 2>/dev/null; then
      echo "no answer from $1: the process ended; the end of $3:" >&2; tail -5 "$3" >&2; return 1
    fi
    sleep 0.1
  done
  echo "no answer from $1 in 10 s; the end of $3:" >&2; tail -5 "$3" >&2; return 1
}

run() { # name label port: bench one fresh emulated farm, through warden proxy when port is set
  "$warden" emulate "${farm[@]}" --layout dp --listen "127.0.0.1:$BASE" --speed "$SPEED" > "$OUT/emulate-$1.log" 2>&1 &
  local emu=$!
  pids+=($emu)
  wait_up "$server/health" "$emu" "$OUT/emulate-$1.log"
  local target=$server via=()
  if [ -n "$3" ]; then
    local cfg=$OUT/proxy-$1.yaml
    cat > "$cfg" <<YAML
listen: 127.0.0.1:$3
admin: 127.0.0.1:$(($3 + 1))
auth: passthrough
scrape_interval: 50ms   # the simulator's 1 s scrape at --speed 20
models:
  - name: Qwen/Qwen3-4B-Instruct-2507
    url: $server
    data_parallel_size: 4
    max_num_seqs: 32
    affinity: on
YAML
    "$warden" proxy --config "$cfg" --log-level error > "$OUT/proxy-$1.log" 2>&1 &
    local proxy=$!
    pids+=($proxy)
    wait_up "http://127.0.0.1:$(($3 + 1))/healthz" "$proxy" "$OUT/proxy-$1.log"
    target=http://127.0.0.1:$3 via=(--proxy-metrics-url "http://127.0.0.1:$(($3 + 1))/metrics")
  fi
  "$warden" bench --target "$target" --metrics-url "$server/metrics" "${via[@]}" --label "$2" \
    --sessions "$SESSIONS" --step "$STEP" --speed "$SPEED" --sample-interval 50ms "${workload[@]}" \
    --requests "$OUT/$1.requests.jsonl" --json > "$OUT/$1.json"
  kill "$emu"; wait "$emu" 2>/dev/null || true
}
run off least-loaded ""
run on affinity $((BASE + 90))

"$warden" sim "${farm[@]}" "${workload[@]}" --sessions "$SESSIONS" --duration "$STEP" --requests "$OUT/sim.requests.jsonl" --json > "$OUT/sim.json"
"$warden" compare --predicted "$OUT/sim.json" --observed "$OUT/off.json" --observed "$OUT/on.json" --out "$OUT/compare.html"
