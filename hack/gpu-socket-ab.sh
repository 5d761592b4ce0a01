#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
#
# hack/gpu-socket-ab.sh OLD_AGENT OLD_CLIENT NEW_AGENT NEW_CLIENT [ROUNDS]
#
# On a machine with a CUDA GPU and PyTorch: two builds of the agent, each with its own Python client tree (a
# client/python directory: its bench/bench_gpu.py runs against its own fabricxfer), measured one after the other
# (agents on one GPU are compared in turn: run side by side, the GPU switches between their contexts), ROUNDS
# times (default 3), then the Python GPU tests against the new build in both allocator modes. An agent given as
# FILE.xz is unpacked first. Everything goes to $OUT (default ./gpu-socket-ab): socket.txt (the bench_gpu.py
# tables, each headed by the side and the time), pytests.txt and times.txt (each step's exit status).
#
#   git archive BASE client/python | tar -x -C /tmp/base   # the old client tree, from the commit compared against
#   hack/gpu-socket-ab.sh /tmp/agent-base /tmp/base/client/python bin/agent client/python
#
# CASES (default a,b,c64,c1g,d,a-pipe,c64-pipe) picks the bench_gpu.py cases; BENCH_ARGS adds arguments to both
# sides' bench_gpu.py (BENCH_ARGS=--interleave where both client trees have it; without MPS it makes the GPU switch
# processes at every call, about 150 us on both sides: not for latency). RESTARTS=N then starts each
# side's agent N times more for the contiguous cases alone (restarts.txt; RESTART_CASES, default c64,c1g, or
# c64-prep,c1g-prep where both client trees have them): the 64 MiB call's median has moved more between agent
# starts than between builds.
set -uo pipefail
if [[ $# -lt 4 ]]; then
  sed -n '5,22p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
out=${OUT:-gpu-socket-ab}
rounds=${5:-3}
cases=${CASES:-a,b,c64,c1g,d,a-pipe,c64-pipe}
read -r -a bench_args <<<"${BENCH_ARGS:-}"
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# agent FILE NAME: FILE as an executable, unpacked when it is an .xz.
agent() {
  if [[ $1 == *.xz ]]; then
    python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' "$1" "$work/$2"
    chmod 755 "$work/$2"
    echo "$work/$2"
  else
    readlink -f "$1"
  fi
}
old_agent=$(agent "$1" old) new_agent=$(agent "$3" new)
old_client=$(readlink -f "$2") new_client=$(readlink -f "$4")
{ date -u; nvidia-smi --query-gpu=name,driver_version,compute_mode,clocks.sm,clocks.mem --format=csv 2>&1; } >"$out/times.txt"

for r in $(seq "$rounds"); do
  for side in old new; do
    a=$old_agent c=$old_client
    [[ $side == new ]] && a=$new_agent c=$new_client
    echo "=== $side round $r $(date -u +%T)" >>"$out/socket.txt"
    timeout 300 python3 "$c/bench/bench_gpu.py" --agent "$a" --cases "$cases" "${bench_args[@]}" >>"$out/socket.txt" 2>&1
    rc=$?
    echo "$(date -u +%T) $side round $r rc $rc" >>"$out/times.txt"
  done
done

for r in $(seq "${RESTARTS:-0}"); do
  for side in old new; do
    a=$old_agent c=$old_client
    [[ $side == new ]] && a=$new_agent c=$new_client
    echo "=== $side start $r $(date -u +%T)" >>"$out/restarts.txt"
    timeout 120 python3 "$c/bench/bench_gpu.py" --agent "$a" --cases "${RESTART_CASES:-c64,c1g}" "${bench_args[@]}" >>"$out/restarts.txt" 2>&1
    echo "$(date -u +%T) $side start $r rc $?" >>"$out/times.txt"
  done
done

sock=$work/fx/kv/agent.sock
mkdir -p "$work/fx"
"$new_agent" standalone --socket-dir "$work/fx" --pool-name kv >"$work/agent.log" 2>&1 &
pid=$!
for _ in $(seq 100); do [[ -S $sock ]] && break; sleep 0.2; done
(
  cd "$new_client" || exit 1
  FABRICXFER_SOCKET=$sock timeout 180 python3 -m unittest tests.test_gpu tests.test_ids >"$out/pytests.txt" 2>&1
  rc=$?
  echo "$(date -u +%T) pytests caching allocator rc $rc" >>"$out/times.txt"
  echo "=== expandable segments" >>"$out/pytests.txt"
  FABRICXFER_SOCKET=$sock PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 180 python3 -m unittest tests.test_gpu >>"$out/pytests.txt" 2>&1
  rc=$?
  echo "$(date -u +%T) pytests expandable segments rc $rc" >>"$out/times.txt"
)
kill "$pid" 2>/dev/null
wait "$pid" 2>/dev/null
date -u >>"$out/times.txt"
