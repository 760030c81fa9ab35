"""lazy_exports: a package's names come from their submodule on first access, then stay; others raise."""

import subprocess
import sys

PROBE = """
import sys
import bionemo.esm2.checkpoints as checkpoints
assert "bionemo.esm2.checkpoints.weights" not in sys.modules and "torch" not in sys.modules
from bionemo.esm2.checkpoints import read_weights
from bionemo.esm2.checkpoints.weights import read_weights as original
assert read_weights is original and vars(checkpoints)["read_weights"] is original
try:
    checkpoints.no_such_name
except AttributeError as error:
    assert "bionemo.esm2.checkpoints" in str(error) and "no_such_name" in str(error), error
else:
    raise AssertionError("no AttributeError")
"""


def test_names_load_on_first_use_and_stay():
    result = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
