"""``python -m aserve.server serve ...`` (the same as ``aserve serve`` once wired into the CLI)."""

from __future__ import annotations

import sys

from aserve.server.command import main

sys.exit(main())
