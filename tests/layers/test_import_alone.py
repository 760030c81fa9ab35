"""``import bionemo.layers`` on its own: megatron-core prepared and imported, no Lightning or NeMo, no torch varlen
module (imported by the first unpadded training step), a spec builds."""

import subprocess
import sys

_PROBE = """
import sys

import bionemo.layers

loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("lightning", "pytorch_lightning", "nemo"))
assert loaded == [], loaded[:10]
assert "bionemo.lightning" not in sys.modules
assert "megatron.core" in sys.modules
assert "torch.nn.attention.varlen" not in sys.modules  # imported on the first unpadded training step only
spec = bionemo.layers.sdpa_layer_spec()
assert spec.submodules.self_attention.module is bionemo.layers.RotarySelfAttention
print("ok")
"""


def test_importing_bionemo_layers_first_needs_no_lightning():
    result = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, check=False, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "ok"
