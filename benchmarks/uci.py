"""UCI regression benchmark of deep GPs; see ``python benchmarks/uci.py --help``."""

from pyro_dgp.bench.uci import main

raise SystemExit(main())
