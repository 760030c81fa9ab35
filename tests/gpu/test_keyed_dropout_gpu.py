"""Keyed dropout on a GPU: the int64 hash gives CUDA the masks it gives the CPU, so devices agree as layouts do."""

import pytest
import torch

pytestmark = pytest.mark.gpu


def test_cuda_draws_the_same_uniforms_as_the_cpu():
    from bionemo.layers.keyed_dropout import keyed_uniform

    sample_index = torch.tensor([0, 7, 123456789, 2**40 + 3])
    shape = torch.Size([4, 300, 33])
    on_cpu = keyed_uniform(shape, 1234, 17, sample_index, salt=2)
    on_cuda = keyed_uniform(shape, 1234, 17, sample_index.cuda(), salt=2)
    assert on_cuda.device.type == "cuda"
    torch.testing.assert_close(on_cuda.cpu(), on_cpu, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_dropout_zeroes_the_cpu_elements_and_scales_the_rest(dtype):
    from bionemo.layers.keyed_dropout import keyed_dropout, keyed_uniform

    torch.manual_seed(0)
    x = torch.randn(8, 64, 320, dtype=dtype)
    sample_index = torch.arange(100, 108)
    on_cpu = keyed_dropout(x, 0.3, 5, 2, sample_index)
    x_cuda = x.cuda().requires_grad_()
    on_cuda = keyed_dropout(x_cuda, 0.3, 5, 2, sample_index)  # sample_index moves to x's device
    assert torch.equal(on_cuda.detach().cpu() == 0, on_cpu == 0)
    torch.testing.assert_close(on_cuda.detach().cpu(), on_cpu)
    kept = (on_cpu != 0).float().mean().item()
    assert abs(kept - 0.7) < 0.01
    on_cuda.sum().backward()
    keep = keyed_uniform(x.shape, 5, 2, sample_index) >= 0.3  # not on_cpu != 0: x itself holds zeros in bf16
    expected_grad = keep.to(dtype) / 0.7
    torch.testing.assert_close(x_cuda.grad.cpu(), expected_grad, rtol=1e-2, atol=1e-2)


def test_cuda_dropout_never_makes_the_host_wait():
    """No host-device synchronisation in the forward or backward (a wait mid-step stalls the launch queue)."""
    from bionemo.layers.keyed_dropout import keyed_dropout

    x = torch.randn(4, 16, 32, device="cuda", requires_grad=True)
    sample_index = torch.arange(4, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        keyed_dropout(x, 0.1, 7, 3, sample_index).sum().backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert x.grad is not None
