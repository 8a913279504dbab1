"""The built-in stages, in pipeline order: the one place stage objects are registered.

The core receives this registry; it never imports a stage. The `flashdraft.stages` entry point (pyproject.toml, the
ecosystem's plugin mechanism) names it, and flashdraft/run/registry.py `builtin()` loads it on first use, in every
process alike: the CLI, a pipeline pod, a torchrun rank, a test.
"""

from flashdraft.components.evaluate.stage import Evaluate
from flashdraft.components.export.stage import Export
from flashdraft.components.extract.stage import Extract
from flashdraft.components.generate.stage import Generate
from flashdraft.components.plan.stage import Plan
from flashdraft.components.prep.stage import Prep
from flashdraft.components.report.stage import Report
from flashdraft.components.stream_end.stage import StreamEnd
from flashdraft.components.train.stage import Train
from flashdraft.run.registry import StageRegistry

BUILTIN = StageRegistry((Plan(), Prep(), Generate(), Extract(), StreamEnd(), Train(), Evaluate(), Export(), Report()))
