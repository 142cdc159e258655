"""``python -m kl_cli``: the same as the ``kl`` command."""

from kl_cli import main

main()
