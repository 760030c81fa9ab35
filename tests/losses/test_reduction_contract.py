"""bionemo.losses is plain torch, and its LossReduction keeps NeMo's MegatronLossReduction contract."""

import inspect
import subprocess
import sys

import torch

from bionemo.losses import LossReduction, MaskedTokenLossReduction, PassthroughLossReduction


def test_importing_losses_loads_neither_nemo_nor_lightning_nor_megatron():
    code = (
        "import sys, bionemo.losses; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'nemo', 'lightning', 'megatron', 'transformers'}))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_same_interface_as_nemos_megatron_loss_reduction():
    """A canary: fails when NeMo's class grows or renames what MegatronParallel calls."""
    from nemo.lightning.megatron_parallel import MegatronLossReduction

    def own(cls: type) -> set[str]:
        return {name for name in vars(cls) if not name.startswith("__")}

    assert own(MegatronLossReduction) == own(LossReduction) == {"setup", "_pre_forward_hook", "forward", "reduce"}
    for name in ("setup", "forward", "reduce"):  # MegatronParallel passes setup()'s arguments by name
        assert list(inspect.signature(getattr(LossReduction, name)).parameters) == list(
            inspect.signature(getattr(MegatronLossReduction, name)).parameters
        ), name
    theirs, ours = MegatronLossReduction(), PassthroughLossReduction()
    assert vars(theirs).keys() - vars(ours).keys() == set()  # the same instance state (batch, module hooks)


def test_setup_then_call_reduces_that_batch_as_nemo_does():
    reduction = MaskedTokenLossReduction()
    logits = torch.randn(4, 2, 7)
    batch = {"labels": torch.randint(0, 7, (2, 4)), "loss_mask": torch.ones(2, 4)}
    reduction.setup(batch)
    called = reduction(logits)  # what megatron's schedule does with the loss function
    direct = reduction.forward(batch, logits)
    torch.testing.assert_close(called[0], direct[0])
    assert isinstance(reduction, LossReduction)
