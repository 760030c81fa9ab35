"""Metrics that may not have been measured: None in JSON (which has no NaN), "not measured" in the summary."""

import math

__all__ = ["finite", "shown"]


def finite(value: float | None) -> float | None:
    """``value``, or None when it is missing or not a finite number."""
    return value if value is not None and math.isfinite(value) else None


def shown(value: float | None, digits: int, missing: str = "not measured") -> str:
    """``value`` with ``digits`` decimals for the summary table; ``missing`` instead of nan, inf or None."""
    measured = finite(value)
    return missing if measured is None else f"{measured:.{digits}f}"
