#!/bin/bash
# Session 36, call G: the decode table (graphs, contiguous and paged) on the committed code,
# the paged min-blocks probe, and the GPU decode tests.
python3 -c "import xdsl" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD:$PWD/bench ATTNFUSE_CACHE_DIR=$(mktemp -d)
start=$(date +%s)
git log -1 --format=%H > $OUT/gpu.txt; nvidia-smi --query-gpu=name,driver_version --format=csv >> $OUT/gpu.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $OUT/gpu.txt
timeout 330 python3 bench/decode.py --out $OUT/decode --graphs --sq 1,4 > $OUT/decode.log 2>&1
echo "decode rc $? at $(( $(date +%s) - start )) s" >> $OUT/decode.log
OUT=$OUT timeout 60 python3 .gpu/probe36c.py > $OUT/probe.log 2>&1
echo "probe rc $? at $(( $(date +%s) - start )) s" >> $OUT/probe.log
timeout $(( 560 - ($(date +%s) - start) )) python3 -m pytest -q tests/gpu/test_paged_gpu.py tests/gpu/test_split_kv_gpu.py \
  --junitxml=$OUT/tests.xml > $OUT/tests.log 2>&1
echo "rc $? at $(( $(date +%s) - start )) s" >> $OUT/tests.log
