import sys

from dtrain_trainer.runner import main

sys.exit(main())
