#!/bin/bash
# Session 34, call A: issue 9's Triton-only sweep (the kernels non-sm_90 GPUs run) at whole-tile S.
python3 -c "import xdsl" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD:$PWD/bench
export ATTNFUSE_CACHE_DIR=$(mktemp -d)
start=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > $OUT/gpu.txt
mkdir -p $OUT/sweep
timeout 520 python3 bench/cost_sweep.py --out $OUT/sweep --triton-only --families d128_g4,d128_g1,d64_g4 \
  --seqs 256,1024,4096,16384,512,2048,8192 --rounds 3 --budget-s 440 > $OUT/sweep.log 2>&1
echo "rc $? done at $(( $(date +%s) - start )) s" >> $OUT/sweep.log
