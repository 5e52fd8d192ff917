#!/bin/bash
# Session 33, call E: the Triton backward kernels after LICM (ea91120) on the GPU.
python3 -c "import xdsl" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD:$PWD/bench
ATTNFUSE_CACHE_DIR=$(mktemp -d) timeout 130 python3 -m pytest -q -p no:cacheprovider --junitxml=$OUT/tests_backward.xml tests/gpu/test_backward_gpu.py > $OUT/tests_backward.txt 2>&1
echo rc=$? >> $OUT/tests_backward.txt
