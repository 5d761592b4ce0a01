#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
#
# old (7d1396b), prev (479e687) and new (main) agents, each with its own Python client, alternated through the
# socket cases; the ladder; a traced diagnostic agent (traced.py is 2026-12-04T1825-traced.py); id packing costs;
# the Python GPU tests.
set -u
cd "$(dirname "$0")/../.."
C=.gpuc/carry
python3 -c "
import lzma,shutil,os
for v in ('agent-old','agent-prev','agent-new','agent-diag','cudacopy-new.test'):
    with lzma.open('$C/%s.xz'%v) as f, open('/tmp/%s'%v,'wb') as o: shutil.copyfileobj(f,o)
    os.chmod('/tmp/%s'%v,0o755)"
{ date -u; nvidia-smi --query-gpu=name,driver_version,compute_mode,clocks.sm,clocks.mem --format=csv; cat /sys/devices/system/clocksource/clocksource0/current_clocksource; nproc; } > $OUT/times.txt
for r in 1 2 3; do
  for side in old prev new; do
    c=client/python; [ $side = old ] && c=$C/oldclient; [ $side = prev ] && c=$C/prevclient
    echo "=== $side round $r $(date -u +%T)" >> $OUT/socket.txt
    timeout 150 python3 $c/bench/bench_gpu.py --agent /tmp/agent-$side --cases a,b,c64,c1g,d,c64-pipe >> $OUT/socket.txt 2>&1
    echo "$(date -u +%T) $side round $r rc $?" >> $OUT/times.txt
  done
done
for r in 1 2; do
  echo "=== ladder new $r" >> $OUT/ladder.txt
  (cd engines/gpu/cudacopy && timeout 100 /tmp/cudacopy-new.test -test.run xxx -test.bench 'GPULatencyLadder/1x(4KiB|64MiB)' -test.benchtime 20000x >> $OUT/ladder.txt 2>&1)
  echo "$(date -u +%T) ladder $r rc $?" >> $OUT/times.txt
done
PYTHONUNBUFFERED=1 timeout 120 python3 $C/traced.py /tmp/agent-diag /tmp/trace.out > $OUT/traced.txt 2>&1
echo "$(date -u +%T) traced rc $?" >> $OUT/times.txt
gzip -c /tmp/trace.out > $OUT/trace.gz
mkdir -p /tmp/fx
/tmp/agent-new standalone --socket-dir /tmp/fx --pool-name kv > /tmp/fx-agent.log 2>&1 &
AP=$!
for i in $(seq 50); do [ -S /tmp/fx/kv/agent.sock ] && break; sleep 0.2; done
(cd client/python && FABRICXFER_SOCKET=/tmp/fx/kv/agent.sock timeout 120 python3 -m unittest tests.test_gpu tests.test_ids > $OUT/pytests.txt 2>&1; echo "$(date -u +%T) pytests caching rc $?" >> $OUT/times.txt
 echo "=== expandable" >> $OUT/pytests.txt
 FABRICXFER_SOCKET=/tmp/fx/kv/agent.sock PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 120 python3 -m unittest tests.test_gpu >> $OUT/pytests.txt 2>&1; echo "$(date -u +%T) pytests expandable rc $?" >> $OUT/times.txt)
kill $AP; wait $AP 2>/dev/null
{ echo "== new client"; timeout 60 python3 $C/packs.py client/python; echo "== prev client"; timeout 60 python3 $C/packs.py $C/prevclient; } > $OUT/packs.txt 2>&1
echo "$(date -u +%T) packs rc $?" >> $OUT/times.txt
date -u >> $OUT/times.txt
