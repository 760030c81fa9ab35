"""``python -m bionemo.cli`` runs the ``bionemo`` command."""

from bionemo.cli.app import main

if __name__ == "__main__":
    main()
