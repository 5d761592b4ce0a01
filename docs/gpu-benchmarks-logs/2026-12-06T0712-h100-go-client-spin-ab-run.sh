#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
#
# The Go client's waited 64 MiB copy through a standalone agent, the client before and after the waited call's
# spin grew with its bytes, alternated three times in one agent's life, beside cuMemcpyAsync and a synchronize;
# then the Go client's GPU test with the new client.
set -u
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } > $OUT/machine.txt 2>&1
python3 -c "
import lzma,shutil,os
for n in ('agent-new','client.test','client-old.test'):
    with lzma.open('.gpuc/%s.xz' % n) as f, open('/tmp/%s' % n,'wb') as o: shutil.copyfileobj(f,o)
    os.chmod('/tmp/%s' % n,0o755)"
mkdir -p /tmp/fx
/tmp/agent-new standalone --socket-dir /tmp/fx --pool-name kv > $OUT/agent.log 2>&1 &
pid=$!
for _ in $(seq 100); do [[ -S /tmp/fx/kv/agent.sock ]] && break; sleep 0.2; done
cd client
for i in 1 2 3; do
  for b in client-old client; do
    echo "=== $b round $i $(date -u +%T)" >> $OUT/goab.txt
    FABRICXFER_SOCKET=/tmp/fx/kv/agent.sock timeout 120 /tmp/$b.test -test.run '^$' -test.bench GPUGoClient -test.count 2 >> $OUT/goab.txt 2>&1
  done
done
FABRICXFER_SOCKET=/tmp/fx/kv/agent.sock timeout 120 /tmp/client.test -test.run GPUGoClient -test.v > $OUT/go-client-gpu-test.txt 2>&1; echo "Go GPU test rc $?" >> $OUT/machine.txt
kill $pid; wait $pid 2>/dev/null
grep -E '^(===|Benchmark.*ns/op)' $OUT/goab.txt | sed 's/BenchmarkGPUGoClientContiguousCopy\///' > $OUT/summary.txt
grep -E '^(---|ok|PASS|FAIL)' $OUT/go-client-gpu-test.txt >> $OUT/summary.txt
cat $OUT/machine.txt >> $OUT/summary.txt
cat $OUT/summary.txt
