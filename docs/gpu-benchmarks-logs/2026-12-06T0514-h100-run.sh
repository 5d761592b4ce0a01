#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors

set -u
{ date -u; nvidia-smi --query-gpu=name,driver_version,compute_mode,clocks.sm,clocks.mem --format=csv; nproc; } > $OUT/machine.txt 2>&1
python3 -c "
import lzma,shutil,os
for v in ('cudacopy.test',):
    with lzma.open('.gpuc/%s.xz'%v) as f, open('/tmp/%s'%v,'wb') as o: shutil.copyfileobj(f,o)
    os.chmod('/tmp/%s'%v,0o755)"
(cd engines/gpu/cudacopy && timeout 150 /tmp/cudacopy.test -test.v -test.run 'GPU' -test.count 1) > $OUT/cudacopy-gpu-tests.txt 2>&1
echo "$(date -u +%T) gpu tests rc $?" >> $OUT/machine.txt
(cd engines/gpu/cudacopy && timeout 90 /tmp/cudacopy.test -test.run xxx -test.bench 'GPUCopyEngineReplay' -test.benchtime 2000x -test.count 3) > $OUT/cudacopy-replay-bench.txt 2>&1
echo "$(date -u +%T) replay bench rc $?" >> $OUT/machine.txt
OUT=$OUT/ab RESTARTS=2 CASES=a,b,c64,c1g,d timeout 330 hack/gpu-socket-ab.sh .gpuc/agent-old.xz client/python .gpuc/agent-new.xz client/python 2
echo "$(date -u +%T) ab rc $?" >> $OUT/machine.txt
{ grep -E '^(--- |ok|FAIL|PASS)' $OUT/cudacopy-gpu-tests.txt | tail -40; grep -E 'Benchmark' $OUT/cudacopy-replay-bench.txt; grep -E '^(===|c 64 MiB|c 1 GiB|d 4 KiB|a 15|b 64)' $OUT/ab/socket.txt $OUT/ab/restarts.txt 2>/dev/null; tail -5 $OUT/ab/pytests.txt; } > $OUT/summary.txt 2>&1
date -u >> $OUT/machine.txt
