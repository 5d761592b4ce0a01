#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
# the copier's GPU tests and contiguous-copy benchmark, then two rounds of main (old) against the kernel route for one range within a GPU (new) through the socket
#
# usage: .gpuc/run.sh ROUNDS
set -u
K=$(cd "$(dirname "$0")" && pwd)
cd "$K/.." 
for f in agent-old agent-new cudacopy.test; do xz -d -k -f "$K/$f.xz"; chmod +x "$K/$f"; done
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
(cd engines/gpu/cudacopy && timeout 200 "$K/cudacopy.test" -test.run 'GPU' -test.v 2>&1) > "$OUT/gputests.txt"
grep -E "^(--- FAIL|FAIL|ok|PASS)|^--- (PASS|SKIP): TestGPU[A-Za-z]+ " "$OUT/gputests.txt" | tail -40
(cd engines/gpu/cudacopy && timeout 150 "$K/cudacopy.test" -test.run XXX -test.bench GPUContiguousCopy -test.benchtime 300x 2>&1) > "$OUT/contig.txt"
grep Benchmark "$OUT/contig.txt" | awk '{print $1, $3, $7, $8}'
python3 "$K/torchref.py" 2>&1 | tee "$OUT/torchref.txt"
for r in $(seq 1 ${1:-2}); do
  for b in old new; do
    [ $((r % 2)) -eq 0 ] && b=$([ $b = old ] && echo new || echo old)
    echo "== round $r agent-$b" | tee -a "$OUT/socket.txt"
    timeout 150 python3 client/python/bench/bench_gpu.py --agent "$K/agent-$b" --cases a,c64,c1g,d 2>&1 | tee -a "$OUT/socket.txt" | tail -8
  done
done
