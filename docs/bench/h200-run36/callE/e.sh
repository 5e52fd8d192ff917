#!/bin/bash
# Session 36, call E: HEAD (base) against the working tree (new, new_s4), then GPU tests.
python3 -c "import xdsl" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1
start=$(date +%s)
git log -1 --format=%H > $OUT/gpu.txt; nvidia-smi --query-gpu=name,driver_version --format=csv >> $OUT/gpu.txt
for v in base new new_s4; do
  if [ $v = base ]; then pp=/tmp/site:$PWD/.gpu/old:$PWD/bench; else pp=/tmp/site:$PWD:$PWD/bench; fi
  PYTHONPATH=$pp ATTNFUSE_CACHE_DIR=$(mktemp -d) VARIANT=$v OUT=$OUT timeout 110 python3 .gpu/probe36.py >> $OUT/probe.log 2>&1
  echo "$v rc $? done at $(( $(date +%s) - start )) s" >> $OUT/probe.log
done
export PYTHONPATH=/tmp/site:$PWD:$PWD/bench ATTNFUSE_CACHE_DIR=$(mktemp -d)
timeout $(( 570 - ($(date +%s) - start) )) python3 -m pytest -q tests/gpu/test_split_kv_gpu.py tests/gpu/test_paged_gpu.py \
  tests/gpu/test_varlen_gpu.py tests/gpu/test_backward_gpu.py tests/gpu/test_edges_gpu.py \
  --junitxml=$OUT/tests.xml > $OUT/tests.log 2>&1
echo "rc $? at $(( $(date +%s) - start )) s" >> $OUT/tests.log
