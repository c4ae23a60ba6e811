"""``python -m zoo.bench``: see :mod:`zoo.bench.cli`."""

from zoo.bench.cli import main

raise SystemExit(main())
