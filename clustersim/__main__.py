"""``python -m clustersim``."""

from clustersim.cli import main

raise SystemExit(main())
