"""Usage: python tests/support/megatron_run.py OUT_DIR --devices N --tp T [--steps S]

Lightning starts the other ranks itself. The work is in megatron_phases.py, imported only when this file
runs as the program: megatron's checkpoint writer starts a spawn-context process that re-imports the main
script, and a main script that imports nemo at the top makes every checkpoint save wait ~25 s for it.
"""

import sys
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from support.megatron_phases import main

    main()
