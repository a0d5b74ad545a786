"""``python -m clustersim.bench --case NAME``: run one benchmark case in this process."""

from __future__ import annotations

import sys

from clustersim.bench.runner import child_main

if __name__ == "__main__":
    sys.exit(child_main())
