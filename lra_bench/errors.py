"""The errors whose message is written for the user, and the one base they share.

A ``UserError``'s message says what is wrong and what to do, in one line: the command line prints it as
``error: <message>`` (never a traceback) and exits with the class's ``exit_code`` (2: the input does not
fit; 1: the work could not be done or kept), and a failed run records it as it is (``cell.outcome``),
where any other error is prefixed with its type. ``attention_zoo`` and ``tasks`` never import
``lra_bench``: their errors for the user are plain ``ValueError``s (``attention_zoo.PluginError``,
``tasks.DataError``), which the command line treats alike.

This module imports nothing, so the light modules (the CLI's parser, the launcher) can raise these.
"""


class UserError(ValueError):
  """An error whose message is written for the user (module docstring)."""

  exit_code = 2


class ConfigError(UserError):
  """A protocol, config key or value that does not exist or does not fit."""


class UsageError(UserError):
  """A command that cannot run as asked: a default directory it cannot write, flags that exclude each other."""
