"""Whether a micro-batch size, a global batch size and a data-parallel size make whole optimizer steps.

Standard library only: the CLI checks batch sizes with it before torch is imported.
"""

__all__ = ["batch_size_problem"]


def batch_size_problem(micro_batch_size: int, global_batch_size: int, data_parallel_size: int) -> str | None:
    """Why these sizes make no global batch (naming the valid values), or ``None`` when they do.

    A global batch must be a whole number of rounds of ``micro_batch_size`` samples on each of the
    ``data_parallel_size`` ranks (at least one round).
    """
    per_round = micro_batch_size * data_parallel_size
    if global_batch_size % per_round == 0:
        return None
    given = (
        f"global batch size {global_batch_size} is not a multiple of micro-batch size x data-parallel size = "
        f"{micro_batch_size} x {data_parallel_size} = {per_round}"
    )
    valid_globals = ", ".join(str(per_round * k) for k in range(1, 4))
    hint = f"valid global batch sizes: {valid_globals}, ..."
    if global_batch_size % data_parallel_size == 0:
        per_rank = global_batch_size // data_parallel_size
        micros = [str(m) for m in range(1, per_rank + 1) if per_rank % m == 0]
        hint += f"; or a micro-batch size of {', '.join(micros)}"
    return f"{given}; {hint}"
