#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
# The copier's GPU tests, then main's agent (new, 7dfa577) and 39e7e8e's (old) alternated through the socket
# cases, interleaved, three times; the Python GPU tests in both allocator modes; the stamped agent; nosig rounds.
set -u
C=.gpuc/carry4
python3 -c "
import lzma,shutil,os
for v in ('agent-old','agent-new','agent-stamps','cudacopy.test'):
    with lzma.open('$C/%s.xz'%v) as f, open('/tmp/%s'%v,'wb') as o: shutil.copyfileobj(f,o)
    os.chmod('/tmp/%s'%v,0o755)"
{ date -u; nvidia-smi --query-gpu=name,driver_version,compute_mode,clocks.sm,clocks.mem --format=csv; nproc; lscpu | grep -E 'Model name'; } > $OUT/times.txt
(cd engines/gpu/cudacopy && timeout 150 /tmp/cudacopy.test -test.run 'TestGPU' -test.v -test.timeout 140s > $OUT/gotests.txt 2>&1)
echo "$(date -u +%T) gotests rc $?" >> $OUT/times.txt
for r in 1 2 3; do
  for v in new old; do
    echo "=== $v interleaved round $r $(date -u +%T)" >> $OUT/socket.txt
    timeout 100 python3 client/python/bench/bench_gpu.py --agent /tmp/agent-$v --interleave --cases a,b,c64,c1g,d >> $OUT/socket.txt 2>&1
    echo "$(date -u +%T) $v interleaved round $r rc $?" >> $OUT/times.txt
  done
done
mkdir -p /tmp/fx
/tmp/agent-new standalone --socket-dir /tmp/fx --pool-name kv > /tmp/fx-agent.log 2>&1 &
AP=$!
for i in $(seq 50); do [ -S /tmp/fx/kv/agent.sock ] && break; sleep 0.2; done
(cd client/python && FABRICXFER_SOCKET=/tmp/fx/kv/agent.sock timeout 80 python3 -m unittest tests.test_gpu > $OUT/pytests.txt 2>&1; echo "$(date -u +%T) pytests caching rc $?" >> $OUT/times.txt
 echo "=== expandable" >> $OUT/pytests.txt
 FABRICXFER_SOCKET=/tmp/fx/kv/agent.sock PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 80 python3 -m unittest tests.test_gpu >> $OUT/pytests.txt 2>&1; echo "$(date -u +%T) pytests expandable rc $?" >> $OUT/times.txt)
kill $AP; wait $AP 2>/dev/null
PYTHONUNBUFFERED=1 timeout 80 python3 $C/stamped.py /tmp/agent-stamps $OUT/stamps.csv > $OUT/stamped.txt 2>&1
echo "$(date -u +%T) stamped rc $?" >> $OUT/times.txt
date -u >> $OUT/times.txt
