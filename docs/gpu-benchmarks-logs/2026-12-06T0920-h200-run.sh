#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
#
# Only on an H200: the done-when's cases (all of ours then all of torch's, and in ten rounds), the Python GPU tests
# in both allocator modes, and the 4 KiB round trip's tail. Anything else: exit 3 at once.
set -u
nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 || { nvidia-smi --query-gpu=name --format=csv,noheader; exit 3; }
python3 -c "
import lzma,shutil,os
for n in ('agent-new',):
    with lzma.open('.gpuc/%s.xz' % n) as f, open('/tmp/%s' % n,'wb') as o: shutil.copyfileobj(f,o)
    os.chmod('/tmp/%s' % n,0o755)"
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; nproc; } > $OUT/machine.txt 2>&1
for i in $(seq ${H200_RUNS:-4}); do
  echo "=== sequential $i $(date -u +%T)" >> $OUT/donewhen.txt
  timeout 120 python3 client/python/bench/bench_gpu.py --agent /tmp/agent-new --cases a,b,c64,c64-prep,c1g,c1g-prep,d >> $OUT/donewhen.txt 2>&1
  echo "=== rounds 10 $i $(date -u +%T)" >> $OUT/donewhen.txt
  timeout 120 python3 client/python/bench/bench_gpu.py --agent /tmp/agent-new --rounds 10 --cases a,b,c64,c64-prep,c1g,c1g-prep,d >> $OUT/donewhen.txt 2>&1
done
rm -rf /tmp/fx8; mkdir -p /tmp/fx8
/tmp/agent-new standalone --socket-dir /tmp/fx8 --pool-name kv --health-addr 127.0.0.1:9481 > $OUT/agent8.log 2>&1 & pid=$!
for _ in $(seq 100); do [[ -S /tmp/fx8/kv/agent.sock ]] && break; sleep 0.2; done
(cd client/python && FABRICXFER_SOCKET=/tmp/fx8/kv/agent.sock timeout 180 python3 -m unittest -v tests.test_gpu tests.test_ids > $OUT/pytests.txt 2>&1; echo "$(date -u +%T) pytests caching rc $?" >> $OUT/machine.txt
 FABRICXFER_SOCKET=/tmp/fx8/kv/agent.sock PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 180 python3 -m unittest -v tests.test_gpu >> $OUT/pytests.txt 2>&1; echo "$(date -u +%T) pytests expandable rc $?" >> $OUT/machine.txt)
TAIL_CASES=t,p,torch TAIL_ROUNDS=2 timeout 90 python3 .gpuc/tail.py /tmp/fx8/kv/agent.sock 20000 > $OUT/tail8.txt 2>&1
kill $pid; wait $pid 2>/dev/null
date -u >> $OUT/machine.txt
cat $OUT/machine.txt
grep -E '^(Ran|OK|FAIL|ERROR)' $OUT/pytests.txt
grep -E '^r[01]' $OUT/tail8.txt
grep -hE '^(===|a 15|b 64|c 64|c 1 GiB|d 4)' $OUT/donewhen.txt 2>/dev/null | grep -v ': done'
