"""The exception types that reach users as a single line, never a traceback."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class ElmoUserError(Exception):
    """A mistake in the user's input (a path, an option, a file) that they can fix.

    The CLI prints ``str(error)`` on one line and exits with status 2; library callers
    catch it like any other exception. The message names what was wrong and the fix.
    """


class SettingError(ElmoUserError):
    """A bad value of a named setting (a keyword argument of the Python API, an
    ``EmbedConfig`` field), said in the terms of whoever set it.

    ``render(name)`` writes the message, calling ``name(setting)`` for every setting it
    mentions: the library's own message uses the Python names (``str(error)``); the CLI
    renders it again with its flags (``error.named(flag_of)``), a job spec with its keys.
    """

    def __init__(self, setting: str, render: Callable[[Callable[[str], str]], str]) -> None:
        self.setting = setting
        self.render = render
        super().__init__(render(str))

    def named(self, name: Callable[[str], str]) -> str:
        return self.render(name)

    def __reduce__(self) -> tuple[Any, ...]:
        # Raised in a Ray actor, it crosses to the driver pickled (cloudpickle takes the
        # render function): rebuilt from its setting and render, not from its message.
        return (SettingError, (self.setting, self.render))


def cli_flag(setting: str) -> str:
    """The flag a verb gives a setting unless it says otherwise: ``init_from`` ->
    ``--init-from``."""
    return "--" + setting.replace("_", "-")
