"""``python -m expiry``: the same command as ``expiry``, whichever ``expiry`` is
first on the PATH (Debian's passwd package installs a /usr/bin/expiry of its own)."""

import sys

from .cli.main import main

sys.exit(main())
