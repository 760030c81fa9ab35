"""The masked copies of the pseudo-perplexity, grouped into forward passes of at most a token budget.

The pseudo-perplexity of a sequence of ``L`` residues takes ``L`` copies of it, each with one residue masked; the
prediction step (:mod:`bionemo.esm2.model.steps`) runs the copies of a batch's sequences in the groups
:func:`copy_groups` cuts, and the recipes count those groups to say what the pseudo-perplexity costs.
"""

from collections.abc import Sequence

__all__ = ["copy_groups"]


def copy_groups(lengths: Sequence[int], budget: int, *, unpadded: bool = False) -> list[tuple[int, int, int]]:
    """Group the masked copies of sequences of ``lengths`` tokens into forward passes of at most ``budget`` tokens.

    The copies are numbered in order, sequence by sequence: sequence ``i`` (``lengths[i]`` tokens, ``<cls>`` and
    ``<eos>`` included) has ``lengths[i] - 2`` copies, one per residue. Groups are cut greedily in that order; a
    group's size is its copies times its longest copy (padded), or the sum of its copies' lengths (``unpadded``).
    A copy longer than ``budget`` forms a group of its own.

    Returns:
        ``(start, stop, width)`` per group: copies ``start..stop - 1``, the longest of them ``width`` tokens.
    """
    groups: list[tuple[int, int, int]] = []
    start = stop = count = used = width = 0
    for length in lengths:
        left = length - 2
        while left > 0:
            wider = max(width, length)
            room = (budget - used) // length if unpadded else budget // wider - count
            if room <= 0 and count == 0:
                room = 1  # one copy longer than the budget: a group of its own
            if room <= 0:
                groups.append((start, stop, width))
                start, count, used, width = stop, 0, 0, 0
                continue
            take = min(room, left)
            stop, count, used, width, left = stop + take, count + take, used + take * length, wider, left - take
    if count:
        groups.append((start, stop, width))
    return groups
