#!/bin/bash
# Session 37, call B: GPU tests after the branch-free in-kernel cos/sin and table-free split
# kernels, then the decode table with the RoPE rows (graphs, Sq 1 and 4).
python3 -c "import xdsl" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD:$PWD/bench ATTNFUSE_CACHE_DIR=$(mktemp -d)
start=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/gpu.txt
timeout 200 python3 -m pytest -q tests/gpu/test_split_kv_gpu.py tests/gpu/test_examples_gpu.py -x \
  --junitxml=$OUT/tests.xml > $OUT/tests.log 2>&1
echo "rc $? at $(( $(date +%s) - start )) s" >> $OUT/tests.log
timeout $(( 570 - ($(date +%s) - start) )) python3 bench/decode.py --out $OUT/decode --graphs --sq 1,4 --rope > $OUT/decode.log 2>&1
echo "decode rc $? at $(( $(date +%s) - start )) s" >> $OUT/decode.log
