#!/bin/bash
# Session 36, call I: the peeled short kernel (new, working tree) against HEAD (base), interleaved; GPU paged tests.
python3 -c "import xdsl" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1
start=$(date +%s)
for v in base new base new; do
  if [ $v = base ]; then pp=/tmp/site:$PWD/.gpu/old:$PWD/bench; else pp=/tmp/site:$PWD:$PWD/bench; fi
  PYTHONPATH=$pp ATTNFUSE_CACHE_DIR=$(mktemp -d) VARIANT=$v OUT=$OUT timeout 45 python3 .gpu/probe36e.py >> $OUT/probe.log 2>&1
  echo "$v rc $? done at $(( $(date +%s) - start )) s" >> $OUT/probe.log
done
export PYTHONPATH=/tmp/site:$PWD:$PWD/bench ATTNFUSE_CACHE_DIR=$(mktemp -d)
timeout $(( 215 - ($(date +%s) - start) )) python3 -m pytest -q tests/gpu/test_paged_gpu.py --junitxml=$OUT/tests.xml > $OUT/tests.log 2>&1
echo "rc $? at $(( $(date +%s) - start )) s" >> $OUT/tests.log
