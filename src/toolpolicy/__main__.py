"""`python -m toolpolicy ...` is the `toolpolicy` command (for launchers that take a module, such as torchrun -m)."""

import sys

from toolpolicy.cli import main

sys.exit(main())
