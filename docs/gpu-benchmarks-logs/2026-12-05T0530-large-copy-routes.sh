#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
#
# The diagnostic agent (phase marks) with the big-copy path as it is (base), through cuMemcpyDtoDAsync (dtod), and
# through the kernel (kern: CopyEngineMin past any size): traced, then the socket cases alternated.
set -u
cd "$(dirname "$0")/../.."
C=.gpuc/carry2  # the agent of the diff beside this file; traced.py is 2026-12-04T1825-traced.py
python3 -c "
import lzma,shutil,os
with lzma.open('$C/agent-diag2.xz') as f, open('/tmp/agent-diag2','wb') as o: shutil.copyfileobj(f,o)
os.chmod('/tmp/agent-diag2',0o755)"
{ date -u; nvidia-smi --query-gpu=name,driver_version,compute_mode,clocks.sm,clocks.mem --format=csv; } > $OUT/times.txt
run_variant() {
  case $1 in
    base) env -u FX_DIAG_DTOD -u FX_DIAG_CEMIN "${@:2}" ;;
    dtod) env -u FX_DIAG_CEMIN FX_DIAG_DTOD=1 "${@:2}" ;;
    kern) env -u FX_DIAG_DTOD FX_DIAG_CEMIN=18446744073709551615 "${@:2}" ;;
  esac
}
for v in base dtod kern; do
  echo "=== traced $v $(date -u +%T)" >> $OUT/traced.txt
  PYTHONUNBUFFERED=1 run_variant $v timeout 120 python3 $C/traced.py /tmp/agent-diag2 /tmp/trace-$v.out >> $OUT/traced.txt 2>&1
  echo "$(date -u +%T) traced $v rc $?" >> $OUT/times.txt
  gzip -c /tmp/trace-$v.out > $OUT/trace-$v.gz
done
for r in 1 2; do for v in base dtod kern; do
  echo "=== $v round $r $(date -u +%T)" >> $OUT/socket.txt
  run_variant $v timeout 150 python3 client/python/bench/bench_gpu.py --agent /tmp/agent-diag2 --cases a,c64,c1g,d >> $OUT/socket.txt 2>&1
  echo "$(date -u +%T) $v round $r rc $?" >> $OUT/times.txt
done; done
date -u >> $OUT/times.txt
