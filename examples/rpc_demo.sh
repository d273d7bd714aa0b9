#!/usr/bin/env bash
# Remote measuring on this machine: TVM's RPC tracker and two of the lab's RPC servers (loopback
# only, each pinned to one core with one thread), a short real tuning run whose kernels are built
# here and timed on the servers, the tracker's view of them, and everything stopped again.
# `make rpc-demo` runs it; RPC_PORT, RPC_KEY and TRIALS change the defaults.
set -euo pipefail
PY=${PYTHON:-.venv/bin/python}
PORT=${RPC_PORT:-9190}
KEY=${RPC_KEY:-local}
TRIALS=${TRIALS:-32}
LOGS=outputs/rpc-demo
mkdir -p "$LOGS"
pids=()
stop() { for pid in "${pids[@]}"; do kill -- "-$pid" 2>/dev/null || true; done; }
trap stop EXIT

echo "== tracker on 127.0.0.1:$PORT, two servers under key '$KEY' (logs in $LOGS/)"
setsid "$PY" -m tvm.exec.rpc_tracker --host 127.0.0.1 --port "$PORT" --port-end $((PORT + 1)) \
    > "$LOGS/tracker.log" 2>&1 & pids+=($!)
for i in 0 1; do
    setsid "$PY" -m tuning.hardware.rpc_server --tracker "127.0.0.1:$PORT" --key "$KEY" --host 127.0.0.1 \
        --port 9091 --cpus $((i % $(nproc))) --threads 1 > "$LOGS/server$i.log" 2>&1 & pids+=($!)
done
for _ in $(seq 120); do
    registered=$("$PY" -m tvm.exec.query_rpc_tracker --host 127.0.0.1 --port "$PORT" 2>/dev/null \
        | grep -c "server:$KEY" || true)
    [ "$registered" -ge 2 ] && break
    if ! kill -0 "${pids[0]}" 2>/dev/null; then
        echo "the tracker did not start (port $PORT taken? RPC_PORT=... picks another):" >&2
        tail -3 "$LOGS/tracker.log" >&2
        exit 1
    fi
    sleep 0.5
done
[ "$registered" -ge 2 ] || { echo "the servers did not register; see $LOGS/" >&2; exit 1; }
"$PY" -m tvm.exec.query_rpc_tracker --host 127.0.0.1 --port "$PORT"

echo "== tuning gemm_64 on them: $TRIALS measurements spread over both servers"
"$PY" -m tunelab run hardware/runner=rpc "hardware.runner.tracker=127.0.0.1:$PORT" "hardware.runner.key=$KEY" \
    hardware.runner.devices=2 hardware.num_threads=1 model=gemm_64 "budget.trials=$TRIALS" budget.plan_size=16

echo "== the tracker after the run (the servers are free again)"
"$PY" -m tvm.exec.query_rpc_tracker --host 127.0.0.1 --port "$PORT"
echo "== stopping the tracker and the servers"
