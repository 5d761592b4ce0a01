#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
#
# The command of this run: run.sh of 15:56 (2026-12-06T1556-h100-run.sh, the same file) with the thread sampler
# of 16:29 (2026-12-06T1629-h100-psr.py) beside it.
python3 .gpuc/psr.py $OUT/psr.txt & spid=$!; bash .gpuc/run29.sh; kill $spid
