"""``python -m calibtune`` = the ``calibtune`` command."""

from calibtune.cli import command

command()
