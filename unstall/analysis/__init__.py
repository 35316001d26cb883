"""`unstall analyze`: where a training job's time goes, what would fix it, and the fix.

The differential method (DESIGN.md section 1) over the loader's known order, in one
direction, a sub-package per stage, each reading only the result of the one before:

- `measure` -> `Measurement`: the synthetic (G), cached (prep stall), cold (fetch
  stall) and fetch-only runs, the storage probe, the machine; in this process or in an
  unchanged script (`measure.script`: its agent, runner, time-out and verification);
- `rates` -> `Derived`: rates G, P's figures, F; stall shares; what the stalls show;
- `model` -> `Analysis`: the what-if model priced on them; P, the bottleneck, the table;
- `recommend` -> `Advice`: every option priced (one `Option` type: the loader setting
  searched, the remedies, ``num_workers="auto"``) and the recommendation chosen among them;
- `report`: the report as data (JSON), terminal tables, HTML, Chrome trace, and every
  sentence about the options.

`pipeline` runs them in order. A stage reads the result of the one before (and the
types and constants of earlier ones); it calls no earlier stage's functions, except
that the recommend stage prices its candidates with the model's `predict`. Nothing
after `measure` measures; the report prices nothing, it lays out (and chooses what to show:
a fetch stall only where fetch can limit the rate, a curve only where it moves).

Nothing here imports torch: ``unstall analyze -- python train.py`` prices the script's runs
in a process of its own without it. The in-process mode's `Workload` (which does) is imported
from `unstall.analysis.measure.workload`.
"""

from unstall.analysis.model.predict import Config, predict
from unstall.analysis.model.stage import Analysis
from unstall.analysis.pipeline import analyze, analyze_script, analyze_workload, report_of
from unstall.analysis.rates.result import Rates

__all__ = [
    "Analysis",
    "Config",
    "Rates",
    "analyze",
    "analyze_script",
    "analyze_workload",
    "predict",
    "report_of",
]
