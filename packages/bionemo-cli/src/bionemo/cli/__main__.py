"""``python -m bionemo.cli`` runs the ``bionemo`` command."""

from bionemo.cli.app import main

main()
