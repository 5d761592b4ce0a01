#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors

set -u
python3 -c "
import lzma,shutil,os
with lzma.open('.gpuc/cudacopy.test.xz') as f, open('/tmp/cudacopy.test','wb') as o: shutil.copyfileobj(f,o)
os.chmod('/tmp/cudacopy.test',0o755)"
cd engines/gpu/cudacopy
for floor in copier engine composite; do
  timeout 100 /tmp/cudacopy.test -test.run xxx -test.bench "GPULatencyLadder/1x4KiB/$floor\$" -test.benchtime 6s -test.cpuprofile $OUT/$floor.pprof > $OUT/$floor.txt 2>&1; echo "rc $?" >> $OUT/$floor.txt
done
