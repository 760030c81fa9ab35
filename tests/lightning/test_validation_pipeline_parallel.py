"""Under pipeline parallelism every stage joins the validation reductions and logs the same values (2 gloo processes).

NeMo fires ``on_megatron_reduce_microbatches_end`` on the last pipeline stage only; a stage left out of an
all-reduce the others entered would hang (here: fail once megatron's groups time out).
"""

import math

import pytest

from support.distributed import run_distributed
from support.pipeline_workers import pp_validation_worker, reference_val_loss

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(300)]


def test_both_stages_log_the_token_weighted_val_loss_and_val_ppl_of_the_last_stage():
    first, last = run_distributed(pp_validation_worker, 2)
    expected = reference_val_loss()
    assert [first["active"], last["active"]] == [True, True]  # both stages drop the per-step val_loss alike
    for stage in (first, last):
        assert stage["logged"]["val_loss"] == pytest.approx(expected, rel=1e-6)
        assert stage["logged"]["val_ppl"] == pytest.approx(math.exp(expected), rel=1e-6)
