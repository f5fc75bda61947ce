"""The one exception type that reaches users as a single line, never a traceback."""


class ElmoUserError(Exception):
    """A mistake in the user's input (a path, an option, a file) that they can fix.

    The CLI prints ``str(error)`` on one line and exits with status 2; library callers
    catch it like any other exception. The message names what was wrong and the fix.
    """
