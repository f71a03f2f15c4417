"""`python -m relay` is `outbox-relay`."""

import sys

from relay.cli import main

sys.exit(main())
