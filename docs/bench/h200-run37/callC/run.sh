#!/bin/bash
# Session 37, call C: GPU example tests (RoPE tables now from the branch-free cos/sin), then the
# decode table at Sq = 1 with RoPE rows and flex compiled afresh per row.
python3 -c "import xdsl" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD:$PWD/bench ATTNFUSE_CACHE_DIR=$(mktemp -d)
start=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/gpu.txt
timeout 110 python3 -m pytest -q tests/gpu/test_examples_gpu.py -x -k "llama3 or qwen3 or gpt_oss" \
  --junitxml=$OUT/tests.xml > $OUT/tests.log 2>&1
echo "rc $? at $(( $(date +%s) - start )) s" >> $OUT/tests.log
timeout $(( 470 - ($(date +%s) - start) )) python3 bench/decode.py --out $OUT/decode --graphs --sq 1 --rope --no-baseline-pipeline > $OUT/decode.log 2>&1
echo "decode rc $? at $(( $(date +%s) - start )) s" >> $OUT/decode.log
