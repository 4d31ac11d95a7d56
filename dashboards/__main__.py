"""``python -m dashboards``: write the dashboard JSON files, or ``--check`` they are current."""

from __future__ import annotations

import sys

from dashboards.cli import main

sys.exit(main())
