"""python -m proxy.tools.datasets OUT: build replay traces from ../shared/data."""

import sys

from proxy.tools.datasets.build import main

sys.exit(main())
