#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
#
# The done-when's cases with main's agent and client, three agent starts, then three more of the contiguous
# cases alone; then the Python GPU tests in both allocator modes.
set -u
{ date -u; nvidia-smi --query-gpu=name,driver_version,compute_mode,clocks.sm,clocks.mem --format=csv; nproc; } > $OUT/machine.txt 2>&1
python3 -c "
import lzma,shutil,os
with lzma.open('.gpuc/agent-new.xz') as f, open('/tmp/agent','wb') as o: shutil.copyfileobj(f,o)
os.chmod('/tmp/agent',0o755)"
for i in 1 2 3; do
  echo "=== full $i $(date -u +%T)" >> $OUT/full.txt
  timeout 120 python3 client/python/bench/bench_gpu.py --agent /tmp/agent --cases a,b,c64,c64-prep,c1g,c1g-prep,d >> $OUT/full.txt 2>&1
  echo "$(date -u +%T) full $i rc $?" >> $OUT/machine.txt
done
for i in 1 2 3; do
  echo "=== start $i $(date -u +%T)" >> $OUT/starts.txt
  timeout 60 python3 client/python/bench/bench_gpu.py --agent /tmp/agent --cases c64,c64-prep,c1g,c1g-prep >> $OUT/starts.txt 2>&1
  echo "$(date -u +%T) start $i rc $?" >> $OUT/machine.txt
done
mkdir -p /tmp/fx
/tmp/agent standalone --socket-dir /tmp/fx --pool-name kv > $OUT/agent.log 2>&1 &
pid=$!
for _ in $(seq 100); do [[ -S /tmp/fx/kv/agent.sock ]] && break; sleep 0.2; done
(cd client/python && FABRICXFER_SOCKET=/tmp/fx/kv/agent.sock timeout 180 python3 -m unittest -v tests.test_gpu tests.test_ids > $OUT/pytests.txt 2>&1; echo "$(date -u +%T) pytests caching rc $?" >> $OUT/machine.txt
 echo "=== expandable segments" >> $OUT/pytests.txt
 FABRICXFER_SOCKET=/tmp/fx/kv/agent.sock PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 180 python3 -m unittest -v tests.test_gpu >> $OUT/pytests.txt 2>&1; echo "$(date -u +%T) pytests expandable rc $?" >> $OUT/machine.txt)
kill $pid; wait $pid 2>/dev/null
{ grep -E '^(===|a 15|b 64|c 64|c 1 GiB|d 4)' $OUT/full.txt $OUT/starts.txt | grep -v ': done'; grep -E '^(Ran|OK|FAIL|ERROR)' $OUT/pytests.txt; cat $OUT/machine.txt; } > $OUT/summary.txt
date -u >> $OUT/machine.txt
