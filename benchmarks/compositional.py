"""Seed 003 Table 1 / Figure 5 reproduction; see pyro_dgp.bench.compositional."""

from pyro_dgp.bench.compositional import main

raise SystemExit(main())
