#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
#
# The agent before (old, 38e7839) and after (new) the lazy transfer context, alternated: the 4 KiB pieces and the
# socket cases; the engine ladder is not built here. Then the Python GPU tests with the new agent.
set -u
cd "$(dirname "$0")/.."
python3 -c "
import lzma,shutil,os
for v in ('old','new'):
    with lzma.open('.gpuc/agent-%s.xz'%v) as f, open('/tmp/agent-%s'%v,'wb') as o: shutil.copyfileobj(f,o)
    os.chmod('/tmp/agent-%s'%v,0o755)"
{ date -u; nvidia-smi --query-gpu=name,driver_version,compute_mode,clocks.sm,clocks.mem --format=csv; } > $OUT/times.txt
python3 -c "
import lzma,shutil,os
for v in ('old','new'):
    with lzma.open('.gpuc/cudacopy-%s.test.xz'%v) as f, open('/tmp/cudacopy-%s.test'%v,'wb') as o: shutil.copyfileobj(f,o)
    os.chmod('/tmp/cudacopy-%s.test'%v,0o755)"
for r in 1 2; do for v in old new; do
  echo "=== ladder $v $r" >> $OUT/ladder.txt
  (cd engines/gpu/cudacopy && timeout 100 /tmp/cudacopy-$v.test -test.run xxx -test.bench 'GPULatencyLadder/1x(4KiB|64MiB)' -test.benchtime 20000x >> $OUT/ladder.txt 2>&1)
  echo "$(date -u +%T) ladder $v $r rc $?" >> $OUT/times.txt
done; done
for r in 1 2; do for v in old new; do
  PYTHONUNBUFFERED=1 timeout 120 python3 docs/gpu-benchmarks-logs/2026-12-04T1820-pieces.py client/python /tmp/agent-$v $v-$r >> $OUT/pieces.txt 2>&1
  echo "$(date -u +%T) pieces $v $r rc $?" >> $OUT/times.txt
done; done
for r in 1 2; do for v in new old; do
  echo "=== socket $v $r $(date -u +%T)" >> $OUT/socket.txt
  timeout 200 python3 client/python/bench/bench_gpu.py --agent /tmp/agent-$v --cases a,c64,c1g,d >> $OUT/socket.txt 2>&1
  echo "$(date -u +%T) socket $v $r rc $?" >> $OUT/times.txt
done; done
mkdir -p /tmp/fx
/tmp/agent-new standalone --socket-dir /tmp/fx --pool-name kv > /tmp/fx-agent.log 2>&1 &
AP=$!
for i in $(seq 50); do [ -S /tmp/fx/kv/agent.sock ] && break; sleep 0.2; done
(cd client/python && FABRICXFER_SOCKET=/tmp/fx/kv/agent.sock timeout 120 python3 -m unittest tests.test_gpu tests.test_ids > $OUT/pytests.txt 2>&1; echo "$(date -u +%T) pytests caching rc $?" >> $OUT/times.txt
 echo "=== expandable" >> $OUT/pytests.txt
 FABRICXFER_SOCKET=/tmp/fx/kv/agent.sock PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 120 python3 -m unittest tests.test_gpu >> $OUT/pytests.txt 2>&1; echo "$(date -u +%T) pytests expandable rc $?" >> $OUT/times.txt)
kill $AP; wait $AP 2>/dev/null
date -u >> $OUT/times.txt
