"""Run a module's main with the commit's grammar advance on llguidance's pool from N rows
(``aserve.sampling.masks._MIN_POOL_ADVANCE``; 128 in the tree, 10**9: always one by one).

    python advance_rows.py N aserve.bench.device_bench --only structured ...
"""

import runpy
import sys

import aserve.sampling.masks as masks

masks._MIN_POOL_ADVANCE = int(sys.argv[1])
module = sys.argv[2]
sys.argv = [module, *sys.argv[3:]]
runpy.run_module(module, run_name="__main__")
