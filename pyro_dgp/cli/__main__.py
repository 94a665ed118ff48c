"""``python -m pyro_dgp.cli``: the ``pyro-dgp`` command."""

import sys

from . import main

sys.exit(main())
