"""Context parallelism of ESM2Model (2 gloo processes): the same outputs and gradients as one rank."""

import pytest
import torch

from support.context_parallel_workers import cp_worker
from support.distributed import run_distributed

pytestmark = pytest.mark.multiprocess


@pytest.mark.parametrize("padded", [True, False], ids=["padded", "full-length"])
def test_context_parallel_outputs_and_gradients_match_one_rank(padded):
    for result in run_distributed(cp_worker, 2, padded):
        real = result["real"].T[..., None]  # [s, b, 1]: outputs at padding positions are not compared
        for name, (ours, reference) in [("logits", result["logits"]), ("hidden", result["hidden"]),
                                         *((f"layer {k}", pair) for k, pair in result["layers"].items())]:  # fmt: skip
            assert ours.shape == reference.shape, name
            torch.testing.assert_close(ours * real, reference * real, atol=1e-5, rtol=1e-5, msg=name)
        assert result["grads"], "no gradients"
        for name, (ours, reference) in result["grads"].items():
            assert ours is not None, f"{name}: no gradient under context parallelism"
            torch.testing.assert_close(ours, reference, atol=1e-5, rtol=1e-4, msg=name)
