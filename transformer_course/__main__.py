"""``python -m transformer_course`` is the same as the ``transformer-course`` command."""

import sys

from .cli import main

sys.exit(main())
