#!/bin/bash
# Session 40, call A: paged address-arithmetic probe; plan-build profile; varlen re-measure.
python3 -c "import xdsl" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD:$PWD/bench ATTNFUSE_CACHE_DIR=$(mktemp -d)
start=$(date +%s)
timeout 240 python3 .gpu/s40_paged.py > $OUT/probe.log 2>&1; echo "rc $? at $(( $(date +%s) - start ))" >> $OUT/probe.log
timeout 60 python3 .gpu/s40_build.py > $OUT/build.log 2>&1; echo "rc $? at $(( $(date +%s) - start ))" >> $OUT/build.log
timeout $(( 560 - ($(date +%s) - start) )) python3 bench/varlen.py --out $OUT/varlen > $OUT/varlen.log 2>&1; echo "rc $? at $(( $(date +%s) - start ))" >> $OUT/varlen.log
grep -v '^{' $OUT/probe.log | tail -14; head -60 $OUT/build.log; tail -15 $OUT/varlen.log
