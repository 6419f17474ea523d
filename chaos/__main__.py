"""`make chaos`: ``python -m chaos`` (chaos/run.py says what it does)."""

import sys

from chaos.run import main

sys.exit(main())
