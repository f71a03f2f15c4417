"""NATS's errors in the relay's terms: what a refused connection means, which JetStream answers
name an event (poison), and what the loop does with a nats-py exception (`action_for`)."""

from __future__ import annotations

from nats.errors import AuthorizationError
from nats.errors import Error as NatsError
from nats.js.errors import APIError

from relay.core.errors import Action

# JetStream's error codes (err_code) that refuse one message for what it is: it would be refused
# again, so the event is poison (the policy stops at it or dead-letters it). Any other refusal is
# the stream's state (full with discard new, sealed: JSStreamStoreFailedF 10077 ...): every later
# message would be refused too, so the relay stops naming it (ServerRefusedError), unless the
# server answered 503 (not available now): a restart then.
MESSAGE_REFUSED = {10054: "message is larger than the stream's max_msg_size (or the server's max_payload)"}
UNAVAILABLE = 503
AUTHORIZATION_VIOLATION = "Authorization Violation"
PERMISSIONS_VIOLATION = "Permissions Violation"


def auth_refused(exc: BaseException) -> str | None:
    """What the server said when it refused the connection's credentials; None for another error."""
    text = str(exc)
    if isinstance(exc, AuthorizationError) or AUTHORIZATION_VIOLATION in text:
        return "refused the credentials (Authorization Violation): check the user, password, token or .creds file"
    if "authorization" in text.lower() and "timeout" in text.lower():
        return "expected credentials and got none in time (Authorization Timeout)"
    return None


def refusal_of(exc: BaseException) -> str | None:
    """Why JetStream refused one message for good (a `MESSAGE_REFUSED` code), else None."""
    if isinstance(exc, APIError) and exc.err_code in MESSAGE_REFUSED:
        return f"{MESSAGE_REFUSED[exc.err_code]} ({exc.description}, err_code {exc.err_code})"
    return None


def describe(exc: BaseException) -> str:
    """A nats-py error as one line: JetStream's description and codes, else its kind and text."""
    if isinstance(exc, APIError):
        return f"{exc.description} (code {exc.code}, err_code {exc.err_code})"
    text = str(exc).removeprefix("nats: ")
    return f"{type(exc).__name__}: {text}" if text and text != type(exc).__name__ else type(exc).__name__


def action_for(exc: BaseException) -> Action | None:
    """What the loop does after a nats-py error that reached it untranslated (None: not one):
    a refused authorization or permission stops the relay, anything else restarts it from its
    stored checkpoint on a fresh connection."""
    if not isinstance(exc, NatsError):
        return None
    text = str(exc)
    if AUTHORIZATION_VIOLATION in text or PERMISSIONS_VIOLATION in text:
        return Action.STOP
    return Action.RESTART
