"""``python -m tvm_rtask.cli``: the ``tvm-rtask`` command line without the console script."""

import sys

from .main import main

sys.exit(main())
