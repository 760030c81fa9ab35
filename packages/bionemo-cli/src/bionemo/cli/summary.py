"""The final summary table."""

from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

__all__ = ["print_summary"]


def print_summary(title: str, rows: Sequence[tuple[str, str]]) -> None:
    """Print ``rows`` as a two-column rich table."""
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    for key, value in rows:
        table.add_row(key, value)
    Console().print(table)
