import math

import pytest
import torch
import torch.nn.functional as F

from bionemo.losses import LOSS_SUM_KEY, MaskedTokenLossReduction, token_cross_entropy


def make_batch(s=5, b=3, v=7, seed=0, mask_p=0.3):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(s, b, v, generator=gen, requires_grad=True)
    labels = torch.randint(0, v, (b, s), generator=gen)
    mask = (torch.rand(b, s, generator=gen) > mask_p).float()
    return logits, labels, mask


def reference_mean(logits, labels, mask):
    """Plain PyTorch: cross-entropy over [b, s] tokens, masked mean."""
    per_token = F.cross_entropy(logits.detach().permute(1, 2, 0).float(), labels, reduction="none")  # [b, s]
    return (per_token * mask).sum() / mask.sum()


def test_token_cross_entropy_matches_torch():
    logits, labels, _ = make_batch()
    ours = token_cross_entropy(logits, labels)
    ref = F.cross_entropy(logits.permute(1, 2, 0), labels, reduction="none")
    torch.testing.assert_close(ours, ref)


def test_negative_labels_give_zero_loss():
    logits, labels, _ = make_batch()
    labels = labels.clone()
    labels[0, :2] = -100
    loss = token_cross_entropy(logits, labels)
    assert loss[0, :2].eq(0).all()
    assert loss[0, 2:].gt(0).all()


def test_shape_errors_name_the_shapes():
    with pytest.raises(ValueError, match=r"token_logits \[s, b, v\] and labels \[b, s\].*\(5, 3, 7\).*\(5, 3\)"):
        token_cross_entropy(torch.zeros(5, 3, 7), torch.zeros(5, 3, dtype=torch.long))


def test_forward_returns_sum_count_and_pair():
    logits, labels, mask = make_batch()
    batch = {"labels": labels, "loss_mask": mask}
    loss_sum, num_tokens, reduced = MaskedTokenLossReduction().forward(batch, {"token_logits": logits})
    ref = reference_mean(logits, labels, mask)
    assert num_tokens.item() == int(mask.sum())
    assert num_tokens.dtype == torch.int32
    torch.testing.assert_close(loss_sum / num_tokens, ref)
    torch.testing.assert_close(reduced[LOSS_SUM_KEY], torch.stack([loss_sum.detach(), mask.sum()]))
    loss_sum.backward()
    assert logits.grad is not None
    assert logits.grad.abs().sum() > 0


def test_gradient_matches_reference():
    logits, labels, mask = make_batch()
    loss_sum, num_tokens, _ = MaskedTokenLossReduction().forward({"labels": labels, "loss_mask": mask}, logits)
    (grad,) = torch.autograd.grad(loss_sum / num_tokens, logits)
    ref_logits = logits.detach().clone().requires_grad_()
    ref = F.cross_entropy(ref_logits.permute(1, 2, 0), labels, reduction="none")
    (ref_grad,) = torch.autograd.grad((ref * mask).sum() / mask.sum(), ref_logits)
    torch.testing.assert_close(grad, ref_grad)


def test_reduce_is_token_weighted_over_micro_batches():
    reduction = MaskedTokenLossReduction()
    micro = [make_batch(seed=i, mask_p=p) for i, p in enumerate([0.1, 0.6, 0.9])]
    outs = [reduction.forward({"labels": lab, "loss_mask": m}, lg)[2] for lg, lab, m in micro]
    ref_sum = sum(reference_mean(lg, lab, m) * m.sum() for lg, lab, m in micro)
    ref_count = sum(m.sum() for _, _, m in micro)
    torch.testing.assert_close(reduction.reduce(outs), ref_sum / ref_count)


def test_zero_valid_tokens_give_no_nan():
    logits, labels, mask = make_batch()
    zero = torch.zeros_like(mask)
    for flavour in (False, True):
        reduction = MaskedTokenLossReduction(validation_step=flavour)
        loss_sum, num_tokens, reduced = reduction.forward({"labels": labels, "loss_mask": zero}, logits)
        assert loss_sum.item() == 0
        assert num_tokens.item() == 0
        assert not math.isnan(reduction.reduce([reduced]).item())
        assert reduction.reduce([reduced]).item() == 0


def test_validation_flavour_detaches_and_train_keeps_graph():
    logits, labels, mask = make_batch()
    batch = {"labels": labels, "loss_mask": mask}
    assert MaskedTokenLossReduction().forward(batch, logits)[0].requires_grad
    val_sum = MaskedTokenLossReduction(validation_step=True).forward(batch, logits)[0]
    assert not val_sum.requires_grad
    torch.testing.assert_close(val_sum, MaskedTokenLossReduction().forward(batch, logits)[0].detach())


def test_inputs_are_not_mutated():
    logits, labels, mask = make_batch()
    logits = logits.detach()
    batch = {"labels": labels, "loss_mask": mask}
    copies = (logits.clone(), labels.clone(), mask.clone())
    MaskedTokenLossReduction().forward(batch, {"token_logits": logits})
    assert torch.equal(logits, copies[0])
    assert torch.equal(labels, copies[1])
    assert torch.equal(mask, copies[2])
    assert set(batch) == {"labels", "loss_mask"}


def test_bool_and_bf16_inputs():
    logits, labels, mask = make_batch()
    ref = reference_mean(logits, labels, mask)
    batch = {"labels": labels, "loss_mask": mask.bool()}
    loss_sum, n, _ = MaskedTokenLossReduction().forward(batch, logits.detach().to(torch.bfloat16))
    assert loss_sum.dtype == torch.float32
    torch.testing.assert_close(loss_sum / n, ref, atol=0.05, rtol=0.02)


def test_missing_batch_key_is_named():
    logits, labels, _ = make_batch()
    with pytest.raises(KeyError, match=r"batch\['loss_mask'\]"):
        MaskedTokenLossReduction().forward({"labels": labels}, logits)


def test_megatron_contract_three_tuple_through_setup_and_call():
    logits, labels, mask = make_batch()
    reduction = MaskedTokenLossReduction()
    reduction.setup({"labels": labels, "loss_mask": mask})
    result = reduction({"token_logits": logits})
    assert len(result) == 3
