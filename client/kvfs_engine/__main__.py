# SPDX-License-Identifier: MIT
import sys

from .engine import main

sys.exit(main())
