#!/bin/bash
python3 -c "import xdsl" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD:$PWD/bench ATTNFUSE_CACHE_DIR=$(mktemp -d)
timeout 560 python3 .gpu/s38_exp.py 420 > $OUT/exp.log 2>&1
echo "rc $?" >> $OUT/exp.log
tail -40 $OUT/exp.log
