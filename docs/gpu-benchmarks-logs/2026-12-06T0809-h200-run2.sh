#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
#
# On any GPU: the Go client's GPU test and benchmarks (64 MiB and 4 KiB) through a standalone agent, three runs.
# On an H200 also the whole of run.sh (the done-when's cases, the Python GPU tests).
set -u
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } > $OUT/machine2.txt 2>&1
python3 -c "
import lzma,shutil,os
for n in ('agent-new','client.test'):
    with lzma.open('.gpuc/%s.xz' % n) as f, open('/tmp/%s' % n,'wb') as o: shutil.copyfileobj(f,o)
    os.chmod('/tmp/%s' % n,0o755)"
mkdir -p /tmp/fx2
/tmp/agent-new standalone --socket-dir /tmp/fx2 --pool-name kv > $OUT/agent2.log 2>&1 &
pid=$!
for _ in $(seq 100); do [[ -S /tmp/fx2/kv/agent.sock ]] && break; sleep 0.2; done
(cd client && FABRICXFER_SOCKET=/tmp/fx2/kv/agent.sock timeout 240 /tmp/client.test -test.run GPUGoClient -test.bench GPUGoClient -test.count 3 -test.v > $OUT/go-client-gpu2.txt 2>&1; echo "$(date -u +%T) Go client rc $?" >> $OUT/machine2.txt)
kill $pid; wait $pid 2>/dev/null
grep -E '^(--- |Benchmark.*ns/op|ok|PASS|FAIL)' $OUT/go-client-gpu2.txt | sed 's/BenchmarkGPUGoClient//'
cat $OUT/machine2.txt
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then SKIP_CUDACOPY=1 bash .gpuc/run.sh; fi
