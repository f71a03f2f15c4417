"""How a command ends: the relay's errors as their exit codes, with one line on stderr."""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable

from relay.core.errors import EXIT_FATAL, RelayError
from relay.core.redact import scrub
from relay.ops.server_errors import as_relay_error


def run_command(prog: str, command: Callable[[], int]) -> int:
    """Run a command, turning the relay's errors into their exit codes with a one-line message
    on stderr (no traceback), and Ctrl-C into 130. A driver's exception is first turned into the
    relay error it amounts to (relay.ops.server_errors: an unexpected server error exits 5).
    Anything else prints its traceback and exits 1, as Python would. Whatever is printed is
    scrubbed of credentials (relay.core.redact)."""
    try:
        return command()
    except RelayError as exc:
        if not exc.logged:
            print(scrub(f"{prog}: {type(exc).__name__}: {exc}"), file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # noqa: BLE001 - printed as Python would, scrubbed of credentials
        translated = as_relay_error(exc)  # a driver's error: the relay error it amounts to
        if isinstance(translated, RelayError):
            if not translated.logged:
                print(scrub(f"{prog}: {type(translated).__name__}: {translated}"), file=sys.stderr)
            return translated.exit_code
        print(scrub(traceback.format_exc()), file=sys.stderr, end="")
        return EXIT_FATAL
