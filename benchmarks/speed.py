"""Speed benchmark of one SVI step; see ``python benchmarks/speed.py --help``."""

from pyro_dgp.bench.speed import main

raise SystemExit(main())
