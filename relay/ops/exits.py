"""How a command ends: the relay's errors as their exit codes, with one line on stderr."""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable

from relay.core.errors import EXIT_FATAL, RelayError
from relay.core.redact import scrub


def run_command(prog: str, command: Callable[[], int]) -> int:
    """Run a command, turning the relay's errors into their exit codes with a one-line message
    on stderr (no traceback), and Ctrl-C into 130. Anything else prints its traceback and exits
    1, as Python would. Whatever is printed is scrubbed of credentials (relay.core.redact)."""
    try:
        return command()
    except RelayError as exc:
        if not exc.logged:
            print(scrub(f"{prog}: {type(exc).__name__}: {exc}"), file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except Exception:  # noqa: BLE001 - printed as Python would, scrubbed of credentials
        print(scrub(traceback.format_exc()), file=sys.stderr, end="")
        return EXIT_FATAL
