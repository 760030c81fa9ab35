"""The ``bionemo`` command line."""
