"""``python -m aserve ...`` is the ``aserve`` command."""

from __future__ import annotations

import sys

from aserve.cli import main

sys.exit(main())
