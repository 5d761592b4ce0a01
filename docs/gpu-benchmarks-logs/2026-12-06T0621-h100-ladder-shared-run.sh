#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors

set -u
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } > $OUT/machine.txt 2>&1
python3 -c "
import lzma,shutil,os
with lzma.open('.gpuc/cudacopy.test.xz') as f, open('/tmp/cudacopy.test','wb') as o: shutil.copyfileobj(f,o)
os.chmod('/tmp/cudacopy.test',0o755)"
cd engines/gpu/cudacopy
timeout 200 /tmp/cudacopy.test -test.run xxx -test.bench 'GPULatencyLadder/(1x4KiB|1x64MiB)/(copier|engine|composite)$' -test.count 3 > $OUT/ladder.txt 2>&1; echo "rc $?" >> $OUT/ladder.txt
