#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
#
# The Go client before (7478c79) and after writing block frames directly, alternated three times against one
# standalone agent of main: its GPU benchmarks (64 MiB and 4 KiB) and, once, its GPU test.
set -u
python3 -c "
import lzma,shutil,os
for n in ('agent-new','client.test','client-old.test'):
    with lzma.open('.gpuc/%s.xz' % n) as f, open('/tmp/%s' % n,'wb') as o: shutil.copyfileobj(f,o)
    os.chmod('/tmp/%s' % n,0o755)"
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv; nproc; } > $OUT/machine.txt 2>&1
rm -rf /tmp/fx9; mkdir -p /tmp/fx9
/tmp/agent-new standalone --socket-dir /tmp/fx9 --pool-name kv --health-addr 127.0.0.1:9483 > $OUT/agent9.log 2>&1 & pid=$!
for _ in $(seq 100); do [[ -S /tmp/fx9/kv/agent.sock ]] && break; sleep 0.2; done
cd client
FABRICXFER_SOCKET=/tmp/fx9/kv/agent.sock timeout 120 /tmp/client.test -test.run GPUGoClient -test.v -test.count 2 > $OUT/go-test.txt 2>&1; echo "go test rc $?" >> $OUT/machine.txt
for i in 1 2 3; do
  for v in client-old client; do
    echo "=== $v $i $(date -u +%T)" >> $OUT/ab.txt
    FABRICXFER_SOCKET=/tmp/fx9/kv/agent.sock timeout 100 /tmp/$v.test -test.run XXX -test.bench GPUGoClient -test.count 1 2>&1 | grep Benchmark >> $OUT/ab.txt
  done
done
kill $pid; wait $pid 2>/dev/null
date -u >> $OUT/machine.txt
cat $OUT/machine.txt; grep -E "^(--- |ok|PASS|FAIL)" $OUT/go-test.txt; cat $OUT/ab.txt
