"""Entry point: `python3 benchmarks/gpu_e2e [--dry]` (the folder is the script; see __init__.py)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: this package and gpu_check

from gpu_e2e.cli import main  # noqa: E402  (after the path fix)

raise SystemExit(main())
