from __future__ import annotations

import logging
import sys

from loadgen.cli import main

if "--engine" in sys.argv:
    from aserve.logs import configure_logging

    # The in-process engine logs every request at debug level: that would bury the report.
    configure_logging("console", logging.WARNING)
sys.exit(main())
