"""pika's errors in the relay's terms: what a refused connection means, what a closed channel or
connection says, and what the loop does with a pika exception (`action_for`)."""

from __future__ import annotations

from pika.adapters.utils.connection_workflow import (
    AMQPConnectionWorkflowFailed,
    AMQPConnectorException,
    AMQPConnectorPhaseErrorBase,
)
from pika.exceptions import (
    AMQPError,
    AuthenticationError,
    ChannelClosed,
    ConnectionClosed,
    ProbableAccessDeniedError,
    ProbableAuthenticationError,
)

from relay.core.errors import Action

# AMQP's reply codes the relay acts on (a channel or connection closed with them).
ACCESS_REFUSED = 403  # the user may not do this (write to the exchange, declare it, use the vhost)
NOT_FOUND = 404  # no such exchange (deleted under the relay: a new session declares it again)
PRECONDITION_FAILED = 406  # an exchange of another kind under the name; a message over max_message_size
NOT_ALLOWED = 530  # no such virtual host, or not for this user
_REFUSALS = (ACCESS_REFUSED, NOT_ALLOWED)


def cause_of(exc: BaseException) -> BaseException:
    """The error under pika's connection workflow wrappers (the last attempt's, the phase's)."""
    while True:
        if isinstance(exc, AMQPConnectionWorkflowFailed) and exc.exceptions:
            exc = exc.exceptions[-1]
        elif isinstance(exc, AMQPConnectorPhaseErrorBase):
            exc = exc.exception
        else:
            return exc


def auth_refused(exc: BaseException) -> str | None:
    """What the server said when it refused the connection's credentials or virtual host; None for
    another error (one a later attempt may get past)."""
    exc = cause_of(exc)
    if isinstance(exc, (AuthenticationError, ProbableAuthenticationError)):
        return "refused the credentials (ACCESS_REFUSED): check the user and password in the URL"
    if isinstance(exc, ProbableAccessDeniedError):
        return "refused access to the virtual host: check the virtual host in the URL and the user's permissions"
    if isinstance(exc, ConnectionClosed) and exc.reply_code in _REFUSALS:
        return f"refused the connection: {exc.reply_text} ({exc.reply_code})"
    return None


def describe(exc: BaseException) -> str:
    """A pika error as one line: the reply text and code of a closed channel or connection, else its
    kind and text."""
    exc = cause_of(exc)
    if isinstance(exc, (ChannelClosed, ConnectionClosed)):
        return f"{type(exc).__name__}: {exc.reply_text} ({exc.reply_code})"
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text and text != type(exc).__name__ else type(exc).__name__


def action_for(exc: BaseException) -> Action | None:
    """What the loop does after a pika error that reached it untranslated (None: not one): a
    refused login, virtual host or permission stops the relay; anything else restarts it from its
    stored checkpoint on a fresh connection."""
    if not isinstance(exc, (AMQPError, AMQPConnectorException)):
        return None
    if auth_refused(exc) is not None:
        return Action.STOP
    cause = cause_of(exc)
    if isinstance(cause, ChannelClosed) and cause.reply_code == ACCESS_REFUSED:
        return Action.STOP
    return Action.RESTART
