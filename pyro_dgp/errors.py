"""Errors raised inside Pyro traces, shown as the user's own error first.

Pyro's ``poutine.trace`` re-raises a ``ValueError`` or ``RuntimeError`` from the traced
function as a new exception of the same type whose message is the original one followed by
the trace's table of site shapes, chained to the original (``raise ... from``); nested traces
(a guide running a model, an ELBO tracing both) wrap it again, so the last thing printed is a
shape table, with the user's message buried above the tracebacks. :func:`user_errors_first`
re-raises the original exception itself, with the shape table kept as a note under it.
"""

from __future__ import annotations

import functools

from .deprecation import keyword_renamer

__all__ = ["unwrap_trace_error", "user_errors_first"]

_SHAPES = "Trace Shapes:"


def unwrap_trace_error(err: BaseException) -> BaseException:
    """The exception Pyro's traces wrapped (module docstring), with their shape tables as
    notes; ``err`` itself if it is not such a wrapper."""
    tables = []
    while (cause := err.__cause__) is not None and type(cause) is type(err):
        message, inner = str(err), str(cause)
        if not (message.startswith(inner) and _SHAPES in message[len(inner):]):
            break
        tables.append(message[len(inner):].strip("\n"))
        err = cause
    if tables:
        # the innermost trace's table names the sites nearest to the error
        err.add_note("Pyro trace at the error (site shapes):\n" + tables[-1])
    return err


def user_errors_first(fn=None, *, renamed: dict[str, str] | None = None):
    """Decorate a public entry point so that an error raised inside a Pyro trace reaches the
    caller as the original exception (:func:`unwrap_trace_error`).

    :param renamed: ``{old: new}`` keywords renamed (:func:`~pyro_dgp.deprecation.
        keyword_renamer`), in the same wrapper: the entry point's warnings keep their
        ``stacklevel``. ``@user_errors_first(renamed={...})``."""
    if fn is None:
        return functools.partial(user_errors_first, renamed=renamed)
    rename = keyword_renamer(fn, fn.__name__, renamed) if renamed else None

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if rename is not None:
            kwargs = rename(args, kwargs)
        try:
            return fn(*args, **kwargs)
        except (ValueError, RuntimeError) as err:
            original = unwrap_trace_error(err)
            if original is err:
                raise
            raise original.with_traceback(original.__traceback__) from None

    return wrapper
