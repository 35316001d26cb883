"""unstall's own remedies, priced for this job: what changes, what it is predicted to give.

Loader settings (workers, cache) are searched by `unstall.analysis.recommend` and can be
applied with ``unstall run --config``. A job whose cores are all busy preparing needs
less CPU per sample, which only a change of pipeline gives; those are priced here from
short measurements on the job's own samples, never assumed:

- ``lean``: unstall's `ImagePipeline(output="uint8")` (decode at reduced scale, crop,
  flip; normalize on the device), timed beside the job's own ``dataset[i]`` on a few of
  its JPEGs, in the job's process (`unstall.analysis.measure.lean`);
- ``coordinate``: K jobs of a sweep on one node preparing each batch once;
- ``gpu``: GPU decode, where a GPU decoder and a CUDA device are present (its rate is
  not guessed: the GPU stage timed on the job's files on that machine, or reported as
  not measured);
- ``cache``: the disk tier or peers for a fetch-bound job (the samples come from local
  disk from the second epoch); for a script's own dataset that opens the files it lists,
  the node cache of those whole files under ``unstall run --config``, or why it cannot
  apply (issue 40: `unstall.analysis.measure.script.files`);
- ``remote``: N remote CPUs (Ray actors) beside the local workers, priced from the
  measured CPU per sample and the transfer timed on one of the job's batches
  (`unstall.analysis.recommend.remote`; issue 45).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from unstall.analysis.model.predict import Config, predict
from unstall.analysis.rates.result import Rates
from unstall.analysis.recommend.remote import remote_row


def remedies(
    rates: Rates,
    base: Config,
    *,
    bottleneck: str,
    measured: float,
    probe: dict[str, float] | None,
    unknown: dict[str, str],
    cuda: bool = False,
    decoder: str | None = None,
    files: dict[str, Any] | None = None,
    gpu_probe: dict[str, Any] | None = None,
    wire: dict[str, Any] | None = None,
    cluster: str | None = None,
    workers: int | None = None,
) -> list[dict[str, Any]]:
    """Each remedy that applies to this bottleneck, with its prediction or why it has none
    (``probe``: the lean pipeline timed beside the job's own ``dataset[i]``; ``cuda``,
    ``decoder``: the machine's GPU decode, as measured; ``files``: whether the file-level
    cache applies to a dataset that opens its files itself, issue 40; ``gpu_probe``: the GPU
    stage's own rate on the job's files, measured on this machine's GPU, issue 47; ``wire``:
    one of the job's batches as a remote worker would ship it, ``cluster``: the Ray cluster
    named where analyze ran, ``workers``: the local workers recommended, issue 45)."""
    out: list[dict[str, Any]] = []
    if bottleneck == "prep" and "prep" not in unknown:
        out.append(_lean(rates, base, probe, measured))
        for k in (2, 4):
            cheaper = replace(rates, prep_cpu_s=rates.prep_cpu_s / k)
            out.append(
                _row(
                    "coordinate",
                    f"if {k} jobs on this node read the same data (a sweep): "
                    "DataLoader(coordinate=True) in each prepares every batch once for all",
                    predict(cheaper, base).samples_per_s,
                    measured,
                    applies="each job: unstall run --config FILE, FILE holding "
                    '{"kwargs": {"coordinate": "SWEEP_NAME"}} (no edit of the script)',
                    config={"kwargs": {"coordinate": "sweep"}},
                )
            )
        out.append(
            _gpu(cuda, decoder, gpu_probe, rates, base, measured, (probe or {}).get("adapt"))
        )
        out.append(remote_row(rates, base, measured, wire, cluster=cluster, workers=workers))
    if bottleneck == "fetch" and "fetch" not in unknown:
        files = files or {}
        if files.get("applies") is not None:
            out.append(_file_cache(rates, base, files, measured))
            return out
        local = replace(rates, latency_s=0.0, bandwidth=1e12)
        out.append(
            _row(
                "cache",
                "keep the samples on this node: unstall.Cache(disk=...) (local disk tier, "
                "on by default for s3://) or peers=unstall.Peers() across nodes; from the "
                "second epoch storage is no longer read",
                predict(local, base).samples_per_s,
                measured,
                applies="unstall.ImageFolder/FileDataset with cache=unstall.Cache(...)",
            )
        )
    return out


def _row(name: str, what: str, predicted: float | None, measured: float, **kw: Any) -> dict:
    return {
        "remedy": name,
        "what": what,
        "predicted_samples_per_s": round(predicted, 1) if predicted is not None else None,
        "predicted_speedup": round(predicted / measured, 2) if predicted and measured else None,
        **kw,
    }


def _file_cache(
    rates: Rates, base: Config, files: dict[str, Any], measured: float
) -> dict[str, Any]:
    """The node cache for a dataset that opens its files itself: every listed file kept on
    the node from the second epoch, or why it cannot apply."""
    what = (
        "keep the files the dataset opens in the node cache (whole files, keyed by path and "
        "versioned by size, mtime and inode): from the second epoch storage is no longer read"
    )
    if not files.get("applies"):
        return {**_row("cache", what, None, measured), "not_applicable": files.get("why")}
    full = predict(rates, replace(base, cache=1.0)).samples_per_s
    return _row(
        "cache",
        what,
        full,
        measured,
        applies='unstall run --config FILE, FILE holding {"kwargs": {"cache": 1.0}} or a '
        "size (no edit of the script)",
        config={"kwargs": {"cache": 1.0}},
    )


def _lean(
    rates: Rates, base: Config, probe: dict[str, float] | None, measured: float
) -> dict[str, Any]:
    """unstall's lean uint8 pipeline, priced by its CPU per sample against the job's own
    ``dataset[i]``, both timed side by side on the job's own JPEGs."""
    what = (
        "unstall.ImageFolder(root, transform=ImagePipeline(output='uint8')) with "
        "DataLoader(device='cuda'): decode at reduced scale + crop + flip on the CPU, "
        "normalize on the GPU"
    )
    applies = "a change of dataset in the script (a few lines)"
    extra: dict[str, Any] = {}
    if probe and probe.get("adapt"):  # a torchvision pipeline unstall runs as its own (issue 49)
        what = (
            f"unstall's lean pipeline in place of the {probe['adapt']}'s torchvision transform "
            "(the same ops and parameters, uint8 on the CPU workers, normalized on the device "
            "or at the hand-off; the same float32 batches)"
        )
        applies = LEAN_APPLIES
        extra["config"] = {"kwargs": {"prep": "lean"}}
    elif probe and probe.get("adapt_refused"):
        extra["not_applied"] = f"prep='lean' leaves this dataset as it is: {probe['adapt_refused']}"
    if not probe:
        return _row(
            "lean",
            what,
            None,
            measured,
            applies=applies,
            not_measured="the dataset lists no JPEG files (torchvision's `samples`, unstall's "
            "keys over local files) to time the pipeline on",
        )
    ratio = probe["lean_cpu_s"] / probe["own_cpu_s"]
    lean = replace(rates, prep_cpu_s=rates.prep_cpu_s * ratio)
    row = _row("lean", what, predict(lean, base).samples_per_s, measured, applies=applies)
    row.update(extra)
    row["worker_cpu_ms_per_sample"] = {
        "now": round(rates.prep_cpu_s * 1e3, 3),
        "lean": round(rates.prep_cpu_s * ratio * 1e3, 3),
    }
    row["probe"] = {k: round(v, 6) if isinstance(v, float) else v for k, v in probe.items()}
    return row


#: How the lean remedy reaches an unchanged torchvision script.
LEAN_APPLIES = (
    'unstall run --config FILE, FILE holding {"kwargs": {"prep": "lean"}} (no edit of the script)'
)


def _gpu(
    cuda: bool,
    decoder: str | None,
    probe: dict[str, Any] | None,
    rates: Rates,
    base: Config,
    measured: float,
    adapt: str | None = None,
) -> dict[str, Any]:
    """GPU decode (`prep="auto"|"gpu"|"hybrid"`): priced where the GPU stage's rate was
    measured on the job's files on this machine (`unstall.gpu.gpu_prep_rate`): the CPU
    workers' rate as measured plus the GPU stage's, capped by what else limits the job (its
    model's rate G, fetch, the loop); else listed with what it needs, never guessed.
    ``adapt``: the recognized torchvision dataset, which a config puts on the GPU stage
    unedited."""
    what = (
        "decode and augment on the GPU beside the CPU workers: unstall.ImageFolder + "
        "DataLoader(device='cuda', prep='auto' or 'hybrid')"
    )
    applies = (
        "a change of dataset in the script (a few lines)"
        if adapt is None
        else 'unstall run --config FILE, FILE holding {"kwargs": {"prep": "auto"}} (no edit of '
        f"the script: the {adapt}'s RandomResizedCrop + flip go to the GPU stage)"
    )
    if cuda and decoder is not None and probe and probe.get("gpu_per_s"):
        cap = predict(replace(rates, prep_cpu_s=0.0), base).samples_per_s
        row = _row("gpu", what, min(cap, measured + probe["gpu_per_s"]), measured)
        return {**row, "decoder": decoder, "applies": applies, "probe": probe}
    if not cuda:
        reason = "not measured: no CUDA device on this machine"
    elif decoder is None:
        reason = "not measured: no GPU decoder installed (pip install 'unstall[dali]')"
    else:
        reason = (
            f"not measured: {decoder} is importable, but the job lists no JPEG files to time it on"
        )
    return {
        "remedy": "gpu",
        "what": what,
        "predicted_samples_per_s": None,
        "predicted_speedup": None,
        "not_measured": reason,
        "decoder": decoder,
        "applies": applies,
    }


def with_lean(rec: dict[str, Any], lean: dict[str, Any], workers: int) -> dict[str, Any]:
    """The recommendation with ``prep="lean"`` where the lean remedy applies to the script
    unchanged (a recognized torchvision pipeline) and is predicted to beat ``rec`` (by
    `GAIN`): the job's own worker count, at which the remedy was priced; ``rec`` as it is
    otherwise. What it replaces stays in ``instead``."""
    predicted = lean.get("predicted_samples_per_s")
    floor = max(rec["predicted_samples_per_s"], rec["measured_samples_per_s"])
    if predicted is None or predicted < GAIN * floor:
        return rec
    current = rec["predicted_current_samples_per_s"]
    out = {k: v for k, v in rec.items() if k not in ("why_unchanged", "fixed", "auto")}
    out.update(
        kwargs={"num_workers": workers, **lean["config"]["kwargs"]},
        config=f"workers={workers}, prep=lean",
        changed=True,
        remedy="lean",
        predicted_samples_per_s=predicted,
        predicted_speedup=round(predicted / current, 3) if current > 0 else None,
        applies=lean["applies"],
        instead={
            "kwargs": rec["kwargs"],
            "predicted_samples_per_s": rec["predicted_samples_per_s"],
        },
    )
    return out


#: The lean remedy is recommended where predicted this much faster than the best setting.
GAIN = 1.1
