#!/bin/bash
# Session 36, call F: new (working tree) against small2 (16-row split kernel up to two waves), twice each, interleaved.
python3 -c "import xdsl" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1
start=$(date +%s)
git log -1 --format=%H > $OUT/gpu.txt
for v in new small2 new small2; do
  if [ $v = small2 ]; then pp=/tmp/site:$PWD/.gpu/small2:$PWD/bench; else pp=/tmp/site:$PWD:$PWD/bench; fi
  PYTHONPATH=$pp ATTNFUSE_CACHE_DIR=$(mktemp -d) VARIANT=$v OUT=$OUT timeout 100 python3 .gpu/probe36b.py >> $OUT/probe.log 2>&1
  echo "$v rc $? done at $(( $(date +%s) - start )) s" >> $OUT/probe.log
done
