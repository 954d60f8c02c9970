"""Session 26 (issue 16): a module run with every commit's grammar advance made one row after
another on the loop's thread (advance_all's pool path, taken from 128 rows, off). On the H100
host of call 3 the commit's advance took 491 us at 256 rows on the pool; on this project's
2-core VM the same 256 tokens consumed one by one take 150-340 us.

    PYTHONPATH=$PWD python serial_advance.py aserve.bench.device_bench --only structured ...
"""

import runpy
import sys

import aserve  # noqa: F401  (before torch)
from aserve.sampling import masks

masks._MIN_POOL_ADVANCE = 1 << 30
module = sys.argv[1]
sys.argv = [module, *sys.argv[2:]]
runpy.run_module(module, run_name="__main__")
