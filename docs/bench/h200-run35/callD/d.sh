#!/bin/bash
# Session 35, call D: the split kernel without its empty first loop (new) against HEAD~ (old), then the GPU decode tests.
# .gpu/paged_probe2.py is callB/paged_probe2.py (one comment differs).
python3 -c "import xdsl" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1
start=$(date +%s)
git log -1 --format=%H > $OUT/gpu.txt; nvidia-smi --query-gpu=name,driver_version --format=csv >> $OUT/gpu.txt
for v in base new; do
  if [ $v = base ]; then pp=/tmp/site:$PWD/.gpu/old:$PWD/bench; else pp=/tmp/site:$PWD:$PWD/bench; fi
  PYTHONPATH=$pp python3 -c "import attnfuse; print('$v', attnfuse.__file__)" >> $OUT/probe3.log 2>&1
  PYTHONPATH=$pp ATTNFUSE_CACHE_DIR=$(mktemp -d) VARIANT=$v OUT=$OUT timeout 75 python3 .gpu/paged_probe2.py >> $OUT/probe3.log 2>&1
  echo "$v done at $(( $(date +%s) - start )) s" >> $OUT/probe3.log
done
export PYTHONPATH=/tmp/site:$PWD:$PWD/bench ATTNFUSE_CACHE_DIR=$(mktemp -d)
timeout $(( 280 - ($(date +%s) - start) )) python3 -m pytest -q -x tests/gpu/test_split_kv_gpu.py tests/gpu/test_paged_gpu.py \
  --junitxml=$OUT/tests_decode.xml > $OUT/tests.log 2>&1
echo "rc $? at $(( $(date +%s) - start )) s" >> $OUT/tests.log
