"""Running an unchanged script under unstall: the swap in every Python process, reports at exit.

`unstall run -- python train.py` (unstall/cli/run.py) puts ``site/`` on
``PYTHONPATH``; its ``sitecustomize`` calls `boot.start`, which swaps
``torch.utils.data.DataLoader`` as soon as torch is imported and writes each
process's loader stats at exit; the first process prints the summary.
"""
