"""Make the docs' reference tables from the code and the bench JSON, so they cannot drift.

Writes ``docs/generated/``:

- ``detection-ops.md``: the transforms.v2 detection ops a plan takes, from its own table;
- ``torchvision-ops.md``: the torchvision operations `prep="lean"` (and the GPU stage) take,
  from the recognizer's own table (`unstall.adapt.recognize`);
- ``remedies.md``: "which remedy when", each remedy's measured row read from
  ``docs/bench/NAME.json`` (the ratio the bench printed), never typed;
- ``benches.md``: every bench of `unstall bench` (`unstall.bench.registry`).

``docs/gen_tables.py`` calls `outputs` and writes these with its own tables (one command:
``python docs/gen_tables.py``; ``--check`` fails when one is out of date).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
if str(DOCS.parent) not in sys.path:  # this checkout's unstall, run from anywhere
    sys.path.insert(0, str(DOCS.parent))
GENERATED = DOCS / "generated"
BENCH = DOCS / "bench"

#: (what the report names, your data or script, remedy, config line, what it needs, bench
#: file stem, the bench's row it is measured by). `None` for "no measured row".
REMEDIES: list[tuple[str, str, str, str, str, str | None, str]] = [
    (
        "compute",
        "any",
        "none: loading is not what limits the job",
        "-",
        "-",
        None,
        "",
    ),
    (
        "fetch",
        "a `Dataset` that lists its files and reads them with Python's `open` (torchvision "
        "`ImageFolder`, `PIL.Image.open(path)`, `torch.load`, `np.load`)",
        "cache of the files in shared memory, shared by every worker and job of the machine",
        '`{"kwargs": {"cache": 0.5}}`',
        "memory (`/dev/shm`) for the cached share; the report prices the size",
        "filecache",
        "epoch 2, cache of half the files, slow storage",
    ),
    (
        "fetch",
        "`unstall.ImageFolder` or shards, local or `s3://`",
        "the same cache, on unstall's own datasets",
        '`{"kwargs": {"cache": "16GiB"}}`',
        "memory (`/dev/shm`); a disk tier is on by default for remote data",
        "cache",
        "cache of half the dataset, shuffled, from epoch 2",
    ),
    (
        "fetch",
        "object storage with high latency",
        "unstall's own datasets on `s3://`: many requests in flight",
        '`unstall.ImageFolder("s3://bucket/train")` (in code)',
        "network; S3 credentials",
        "s3",
        "20 ms latency, fetch only",
    ),
    (
        "fetch",
        "several nodes, a dataset larger than one node's cache",
        "a cache partitioned over the nodes",
        '`cache=unstall.Cache("64GiB", peers=unstall.Peers())` (in code)',
        "`torchrun` over the nodes; each node's peer port reachable",
        "distributed",
        "4 nodes, dataset 2x a node's cache, against each caching alone",
    ),
    (
        "prep",
        "a torchvision `ImageFolder` of JPEGs with a transform unstall recognizes",
        "lean: unstall's own decode and augment, uint8 batches",
        '`{"kwargs": {"prep": "lean"}}`',
        "CPU cores (fewer than before); normalization on the GPU where there is one",
        "torchvision",
        "the unchanged script under the analyzer's config",
    ),
    (
        "prep",
        "a torchvision detection script: JPEGs with boxes through a `transforms.v2` pipeline "
        "shaped like the SSD/SSDlite references (zoom-out, IoU crop, flips, resize, colour "
        "distortion)",
        "lean: the pipeline run as one plan, each output pixel made once, boxes moved by "
        "torchvision's own code",
        '`{"kwargs": {"prep": "lean"}}`',
        "CPU cores (fewer than before)",
        "detection-run1",
        "the unchanged SSD-preset script",
    ),
    (
        "prep",
        "a deterministic preparation (a validation pass, audio decoded and resampled, "
        "features), any map-style `Dataset`",
        "cache the prepared samples whole (checked deterministic first)",
        '`{"kwargs": {"cache": {"size": "8GiB", "hold": "samples"}}}`',
        "memory for the prepared samples",
        "cachepoints",
        "a validation pass from its second on",
    ),
    (
        "prep",
        "audio clips read with soundfile and resampled with soxr (an M5-style script)",
        "the same cache of prepared samples: nothing decoded or resampled after epoch 1 "
        "(the file cache does not see soundfile's reads)",
        '`{"kwargs": {"cache": {"size": "8GiB", "hold": "samples"}}}`',
        "memory for the prepared clips (about the size of the compressed files at 8 kHz)",
        "audio",
        "the unchanged script, from epoch 2",
    ),
    (
        "prep",
        "a torchvision `ImageFolder` training with `RandomResizedCrop`, a cache too small for "
        "every decoded image",
        "cache decoded images for part of the dataset, bytes for the rest",
        '`{"kwargs": {"cache": {"size": "8GiB", "hold": "auto"}}}`',
        "memory; the decoded share follows the size",
        None,
        "",
    ),
    (
        "prep",
        "the same, with `RandomResizedCrop` (+ flip) to float, on a CUDA machine",
        "GPU decode, or split between CPU and GPU",
        '`{"kwargs": {"prep": "hybrid"}}` (or `"gpu"`, `"auto"`)',
        "a CUDA GPU; the `dali` extra (or `dali-cu12`)",
        "train-resnet18#unstall hybrid",
        "ResNet-18 on a GPU, the hybrid row against torch's (see the `train` rows)",
    ),
    (
        "prep",
        "any map-style `Dataset` (audio, text, video, your own augmentation) with idle cores",
        "more workers, tuned while the job runs",
        '`{"kwargs": {"num_workers": "auto"}}`',
        "idle CPU cores",
        "autotune",
        "against the best fixed `num_workers`",
    ),
    (
        "prep",
        "any map-style `Dataset` that can be pickled, with every local core busy",
        "remote workers: Ray actors on CPU machines",
        '`{"kwargs": {"seed": 0, "remote": {"address": "HEAD:6379", "workers": 32}}}`',
        "a Ray cluster of CPU nodes; the `ray` extra",
        "remote",
        "2 local workers + 4 Ray actors",
    ),
    (
        "prep",
        "K jobs of a sweep on one node, same data and pipeline",
        "prepare each batch once for all K",
        '`{"kwargs": {"seed": 0, "coordinate": true}}`',
        "the jobs on one node",
        "hpsearch",
        "4 sweep jobs, aggregate",
    ),
]


def remedies_table(headline_rows: list[tuple[str, ...]], bench: Path = BENCH) -> str:
    """The table; a remedy's measured figure is its bench's headline row (the README's
    table) where it has one, else the ratio its JSON holds."""
    headline = {}
    for row in headline_rows:
        headline.setdefault(row[0], row[5])  # a bench's first row
    rows = [
        "| the report names | your data or script | remedy | config line | needs | measured |",
        "|---|---|---|---|---|---|",
    ]
    for limit, data, remedy, config, needs, stem, what in REMEDIES:
        measured = "not measured" if what else "-"
        if stem is not None:  # "NAME" (its headline) or "NAME#VARIANT" (that row's ratio)
            stem, _, variant = stem.partition("#")
            path = bench / f"{stem}.json"
            name = stem.split("-")[0]
            if path.is_file():
                result = json.loads(path.read_text())["result"]
                if variant:
                    shown = f"{float(result['variants'][variant]['ratio_vs_torch']):.2f}x"
                else:
                    shown = headline.get(name) or f"{float(result.get('ratio')):.2f}x"
                measured = f"[`{name}`](benchmarks.md#{name}): {shown} ({what})"
            else:
                measured = f"[`{name}`](benchmarks.md#{name}): no run committed"
        rows.append(f"| {limit} | {data} | {remedy} | {config} | {needs} | {measured} |")
    return "\n".join(rows) + "\n"


def ops_table() -> str:
    """The torchvision operations the recognizer takes, from its own table."""
    from unstall.adapt.recognize import GEOMETRIC_OPS, TENSOR_OPS

    rows = ["| torchvision operation | kind |", "|---|---|"]
    rows += [f"| `{name}` | geometric (on uint8) |" for name in GEOMETRIC_OPS]
    rows += [
        f"| `{name}` | makes the tensor: uint8 until the batch is made, then float32 "
        "(0-1, normalized) |"
        for name in TENSOR_OPS
    ]
    return "\n".join(rows) + "\n"


def detection_ops_table() -> str:
    """The transforms.v2 detection ops a plan takes, from the recognizer's own table
    (`unstall.adapt.detection.steps`), each with what the plan does with it."""
    from unstall.adapt.detection.steps import GEOMETRY, IMAGE, PHOTOMETRIC, TARGET

    kinds = (
        (GEOMETRY, "geometric: composed on the boxes, its pixels made in the one resampling step"),
        (PHOTOMETRIC, "photometric: applied at output size, with torchvision's draws"),
        (IMAGE, "type and value: run as it is, on the planned image"),
        (TARGET, "target: run as it is, on the planned boxes"),
    )
    rows = ["| transforms.v2 operation | what the plan does with it |", "|---|---|"]
    rows += [f"| `{name}` | {what} |" for names, what in kinds for name in names]
    return "\n".join(rows) + "\n"


def benches_list() -> str:
    from unstall.bench.registry import BENCHMARKS

    return ", ".join(f"[`{n}`](benchmarks.md#{n})" for n in BENCHMARKS) + "\n"


#: The peers the comparison page measures against, as the headline table names them.
PEERS = ("Mosaic Streaming", "webdataset")
#: DALI's own pipeline against unstall's best variant, from `unstall bench train`'s runs.
DALI = "DALI (own pipeline)"


def measured_against_peers(headline_rows: list[tuple[str, ...]], bench: Path = BENCH) -> str:
    """The rows where unstall was measured against a peer project, in the same run: the
    headline table's (`shards`) and `unstall bench train`'s DALI rows (share of G)."""
    rows = [
        "| peer | bench | what is compared | theirs | unstall | ratio |",
        "|---|---|---|---|---|---|",
    ]
    for bench_name, what, peer, theirs, ours, ratio in headline_rows:
        if peer in PEERS:
            link = f"[`{bench_name}`](benchmarks.md#{bench_name})"
            rows.append(f"| {peer} | {link} | {what} | {theirs} | {ours} | {ratio} |")
    for path in sorted(bench.glob("train-*.json")):
        run = json.loads(path.read_text())
        res = run["result"]
        variants = res.get("variants", {})
        if DALI not in variants:
            continue
        name, best = max(
            ((k, v) for k, v in variants.items() if k.startswith("unstall")),
            key=lambda kv: kv[1]["fraction_of_G"],
        )
        theirs, ours = variants[DALI]["fraction_of_G"], best["fraction_of_G"]
        what = (
            f"{res['model']} training on {res.get('device', run['machine'])}, share of the "
            f"model's own rate G (unstall: {name})"
        )
        rows.append(
            f"| DALI | [`train`](benchmarks.md#train) | {what} | {theirs:.2f} | {ours:.2f} "
            f"| {ours / theirs:.2f}x |"
        )
    return "\n".join(rows) + "\n"


def train_goals() -> str:
    """`unstall bench train`'s goals, from its code: the one statement of them."""
    from unstall.bench import train

    models = sorted(train.GOAL_FRACTION)
    share = ", ".join(f"{m} {train.GOAL_FRACTION[m]:.2f}" for m in models)
    vs_torch = ", ".join(f"{m} {train.GOAL_RATIO[m]:.1f}x" for m in sorted(train.GOAL_RATIO))
    vs_dali = ", ".join(f"{m} {train.GOAL_VS_DALI[m]:.2f}x" for m in sorted(train.GOAL_VS_DALI))
    return (
        "| goal of `unstall bench train` (one GPU, 16 cores; `unstall/bench/train.py`) | |\n"
        "|---|---|\n"
        f"| unstall's best variant, share of the model's own rate G | {share} |\n"
        f"| unstall's best variant over torch's loader | {vs_torch} |\n"
        f"| unstall's best variant over DALI's own pipeline | {vs_dali} |\n"
        f"| the training loop thread's CPU per batch, every unstall variant | "
        f"at most {train.GOAL_MAIN_CPU_MS:g} ms |\n"
    )


#: `unstall bench autotune`'s jobs, as the guide names them
AUTOTUNE_JOBS = {
    "prep_bound": "prep-bound, asked 8 x 4",
    "compute_bound": "compute-bound",
    "fetch_bound_s3": "S3 at 20 ms",
    "cost_doubles": "cost doubles half way",
    "two_ranks": "two ranks, one node",
}


def _setting(value: object, inflight: object = None) -> str:
    """A pool setting as words: ``2w_128inflight`` -> "2 workers x 128 in flight"."""
    if isinstance(value, list):
        return " + ".join(str(v) for v in value)
    text = str(value)
    if "w_" in text:
        workers, flight = text.split("w_")
        return f"{workers} workers x {flight.removesuffix('inflight')} in flight"
    return f"{text} x {inflight} in flight" if inflight else text


def autotune_summary(bench: Path = BENCH) -> str:
    """Per job of the committed `unstall bench autotune` run: the best fixed setting, what
    `num_workers="auto"` settled on, and the rate and CPU ratios."""
    path = bench / "autotune.json"
    if not path.is_file():
        return "*No run of `unstall bench autotune` is committed.*\n"
    res = json.loads(path.read_text())["result"]
    rate = {(r["case"], r["loader"]): r["samples_per_s"] for r in res["rows"]}
    rows = [
        "| job | best fixed setting (samples/s) | auto settled on (samples/s) | rate ratio "
        "| CPU ratio |",
        "|---|---|---|---|---|",
    ]
    for job, name in AUTOTUNE_JOBS.items():
        summary = res["jobs_summary"].get(job)
        if summary is None:
            continue
        best, auto = summary["best_fixed"], rate[(job, "auto")]
        settled = _setting(summary["settled_on"], summary.get("settled_inflight"))
        rows.append(
            f"| {name} | {_setting(best)} ({rate[(job, str(best))]:,.0f}/s) "
            f"| {settled} ({auto:,.0f}/s) | {summary['ratio']:.3f} "
            f"| {summary['cpu_ratio']:.3f} |"
        )
    return "\n".join(rows) + "\n"


def outputs(headline_rows: list[tuple[str, ...]]) -> dict[Path, str]:
    """Every file this module writes, with its content (``headline_rows``: gen_tables's)."""
    return {
        GENERATED / "peers-measured.md": measured_against_peers(headline_rows),
        GENERATED / "remedies.md": remedies_table(headline_rows),
        GENERATED / "train-goals.md": train_goals(),
        GENERATED / "autotune-summary.md": autotune_summary(),
        GENERATED / "torchvision-ops.md": ops_table(),
        GENERATED / "detection-ops.md": detection_ops_table(),
        GENERATED / "benches.md": benches_list(),
        **_torchvision().outputs(),
    }


def _torchvision():
    """docs/gen_torchvision.py (the torchvision guide's tables), loaded by path (the docs
    folder is no package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gen_torchvision", DOCS / "gen_torchvision.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
