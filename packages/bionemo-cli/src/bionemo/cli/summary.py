"""The final summary: a table of results, then the paths it wrote, each whole on its own line."""

from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

__all__ = ["print_summary"]


def print_summary(title: str, rows: Sequence[tuple[str, str | Path]], console: Console | None = None) -> None:
    """Print the text ``rows`` as a two-column table and the ``Path`` rows below it as ``name: path`` lines.

    Nothing is cut at any terminal width or in a pipe: table cells wrap, and each path is printed unwrapped on
    a line of its own (rich would fold a long path across lines inside a cell), so it can be copied.
    """
    console = console or Console()
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column(style="bold", overflow="fold")
    table.add_column(overflow="fold")
    paths = []
    for key, value in rows:
        if isinstance(value, Path):
            paths.append((key, value))
        else:
            table.add_row(key, value)
    console.print(table)
    for key, path in paths:
        console.print(f"{key}: {path}", soft_wrap=True, highlight=False, markup=False)
