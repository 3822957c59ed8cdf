"""`python -m dtrain_operator.cli`: the `dtrain` command."""

import sys

from dtrain_operator.cli.main import main

sys.exit(main())
