#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
# Sequential socket cases (not interleaved: alternating torch's and the agent's CUDA contexts call by call makes
# the GPU switch contexts each call), new then old then new; the copier's latency ladder.
set -u
C=.gpuc/carry4
python3 -c "
import lzma,shutil,os
for v in ('agent-old','agent-new','cudacopy.test'):
    with lzma.open('$C/%s.xz'%v) as f, open('/tmp/%s'%v,'wb') as o: shutil.copyfileobj(f,o)
    os.chmod('/tmp/%s'%v,0o755)"
{ date -u; nvidia-smi --query-gpu=name,driver_version,compute_mode,clocks.sm,clocks.mem --format=csv; } > $OUT/times.txt
for v in new old new old; do
  echo "=== $v sequential $(date -u +%T)" >> $OUT/socket.txt
  timeout 100 python3 client/python/bench/bench_gpu.py --agent /tmp/agent-$v --cases a,b,c64,c1g,d >> $OUT/socket.txt 2>&1
  echo "$(date -u +%T) $v sequential rc $?" >> $OUT/times.txt
done
(cd engines/gpu/cudacopy && timeout 60 /tmp/cudacopy.test -test.run xxx -test.bench 'GPULatencyLadder/1x(4KiB|64MiB)' -test.benchtime 20000x > $OUT/ladder.txt 2>&1)
echo "$(date -u +%T) ladder rc $?" >> $OUT/times.txt
