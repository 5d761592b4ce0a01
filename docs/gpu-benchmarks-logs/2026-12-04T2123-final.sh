#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
#
# The final agent: the socket cases three times and once with expandable segments, the 4 KiB pieces, the Python GPU tests
# in both allocator modes.
set -u
cd "$(dirname "$0")/.."
python3 -c "
import lzma,shutil,os
with lzma.open('.gpuc/agent.xz') as f, open('/tmp/agent','wb') as o: shutil.copyfileobj(f,o)
os.chmod('/tmp/agent',0o755)"
{ date -u; nvidia-smi --query-gpu=name,driver_version,compute_mode,clocks.sm,clocks.mem --format=csv; } > $OUT/times.txt
for i in 1 2 3; do
  echo "=== socket $i $(date -u +%T)" >> $OUT/socket.txt
  timeout 200 python3 client/python/bench/bench_gpu.py --agent /tmp/agent --cases a,b,c64,c1g,d >> $OUT/socket.txt 2>&1
  echo "$(date -u +%T) socket $i rc $?" >> $OUT/times.txt
done
echo "=== expandable $(date -u +%T)" >> $OUT/socket.txt
timeout 200 python3 client/python/bench/bench_gpu.py --agent /tmp/agent --expandable --cases a,c64,c1g,d >> $OUT/socket.txt 2>&1
echo "$(date -u +%T) socket expandable rc $?" >> $OUT/times.txt
PYTHONUNBUFFERED=1 timeout 120 python3 docs/gpu-benchmarks-logs/2026-12-04T1820-pieces.py client/python /tmp/agent final > $OUT/pieces.txt 2>&1
echo "$(date -u +%T) pieces rc $?" >> $OUT/times.txt
mkdir -p /tmp/fx
/tmp/agent standalone --socket-dir /tmp/fx --pool-name kv > /tmp/fx-agent.log 2>&1 &
AP=$!
for i in $(seq 50); do [ -S /tmp/fx/kv/agent.sock ] && break; sleep 0.2; done
(cd client/python && FABRICXFER_SOCKET=/tmp/fx/kv/agent.sock timeout 120 python3 -m unittest tests.test_gpu tests.test_ids > $OUT/pytests.txt 2>&1; echo "$(date -u +%T) pytests caching rc $?" >> $OUT/times.txt
 echo "=== expandable" >> $OUT/pytests.txt
 FABRICXFER_SOCKET=/tmp/fx/kv/agent.sock PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 120 python3 -m unittest tests.test_gpu >> $OUT/pytests.txt 2>&1; echo "$(date -u +%T) pytests expandable rc $?" >> $OUT/times.txt)
kill $AP; wait $AP 2>/dev/null
date -u >> $OUT/times.txt
