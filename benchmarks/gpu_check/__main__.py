"""Entry point: `python3 benchmarks/gpu_check [--quick] [--json FILE]` (the folder is the script; see __init__.py)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: this package and bench_codecs

from gpu_check.bootstrap import bootstrap  # noqa: E402  (after the path fix)

bootstrap()

from gpu_check.cli import main  # noqa: E402  (after the bootstrap: the checks import flashdraft and transformers)

raise SystemExit(main())
