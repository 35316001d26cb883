"""unstall's own remedies, priced for this job: what changes, what it is predicted to give.

Loader settings (workers, cache) are searched by `unstall.analysis.recommend` and can be
applied with ``unstall run --config``. A job whose cores are all busy preparing needs
less CPU per sample, which only a change of pipeline gives; those are priced here from
short measurements on the job's own samples, never assumed:

- ``lean``: unstall's `ImagePipeline(output="uint8")` (decode at reduced scale, crop,
  flip; normalize on the device), timed beside the job's own ``dataset[i]`` on a few of
  its JPEGs, in the job's process (`unstall.analysis.measure.lean`);
- ``detection``: a torchvision detection pipeline run as unstall's plan (``prep="lean"``),
  timed beside the job's own ``dataset[i]`` on its own samples, in place of ``lean``
  (`unstall.analysis.recommend.detection`);
- ``coordinate``: K jobs of a sweep on one node preparing each batch once;
- ``gpu``: GPU decode, where a GPU decoder and a CUDA device are present (its rate is
  not guessed: the GPU stage timed on the job's files on that machine, or reported as
  not measured);
- ``cache``: the disk tier or peers for a fetch-bound job (the samples come from local
  disk from the second epoch); for a script's own dataset that opens the files it lists,
  the node cache of those whole files under ``unstall run --config``, or why it cannot
  apply (`unstall.analysis.measure.script.files`);
- ``samples``: the whole prepared sample kept on the node (``Cache(hold="samples")``) for a
  deterministic preparation (`unstall.analysis.recommend.samples`);
- ``remote``: N remote CPUs (Ray actors) beside the local workers, priced from the
  measured CPU per sample and the transfer timed on one of the job's batches
  (`unstall.analysis.recommend.remote`).

Each is an `Option` (`unstall.analysis.recommend.option`): its price and the facts it rests
on; the words that present it are the report's (`unstall.analysis.report.words`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from unstall.analysis.model.predict import predict
from unstall.analysis.recommend.detection import detection_row
from unstall.analysis.recommend.option import EDIT, SWEEP, Job, Option, option
from unstall.analysis.recommend.remote import remote_row
from unstall.analysis.recommend.samples import sample_cache_row


@dataclass(frozen=True)
class Seen:
    """What the measure stage saw that the remedies are priced from.

    Attributes:
        lean: the lean pipeline timed beside the job's own ``dataset[i]``
            (`unstall.analysis.measure.lean`), None where the dataset lists no JPEGs.
        cuda, decoder: a CUDA device, and the GPU decoder importable, on this machine.
        gpu: the GPU stage's own rate on the job's files, measured on this machine's GPU.
        files: whether the node cache applies to a dataset that opens its files itself
            (`unstall.analysis.measure.script.files`; empty for unstall's own datasets).
        wire: one of the job's batches as a remote worker would ship it.
        cluster: the Ray cluster named where analyze ran (``$RAY_ADDRESS``).
        samples: whether the whole-sample cache applies to the script's dataset, its bytes
            and read cost per sample (`unstall.analysis.measure.script.samples`).
        room: the bytes a node cache may take on this machine (free shared memory).
        detection: the detection plan timed beside the job's own ``dataset[i]``
            (`unstall.analysis.measure.script.detection`), None where the dataset is not a
            detection one.
    """

    lean: dict[str, Any] | None = None
    cuda: bool = False
    decoder: str | None = None
    gpu: dict[str, Any] | None = None
    files: dict[str, Any] | None = None
    wire: dict[str, Any] | None = None
    cluster: str | None = None
    samples: dict[str, Any] | None = None
    room: float | None = None
    detection: dict[str, Any] | None = None


#: Jobs of a sweep the ``coordinate`` remedy is priced for (each prepares 1/K of the batches).
SWEEP_JOBS = (2, 4)


def remedies(job: Job, seen: Seen = Seen(), *, workers: int | None = None) -> list[Option]:
    """Each remedy that applies to ``job``'s bottleneck, priced from what was ``seen`` (or
    said unpriced, with why); ``workers``: the local workers the recommendation runs, which
    remote workers join."""
    out: list[Option] = []
    rates, base, measured = job.rates, job.base, job.measured
    if job.bottleneck == "prep" and "prep" not in job.unknown:
        if seen.detection is not None:
            out.append(detection_row(job, seen.detection))
        else:
            out.append(_lean(job, seen.lean))
        for k in SWEEP_JOBS:
            cheaper = replace(rates, prep_cpu_s=rates.prep_cpu_s / k)
            coordinate = {"kwargs": {"coordinate": "sweep"}}
            out.append(
                option(
                    "coordinate",
                    measured,
                    predict(cheaper, base),
                    config=coordinate,
                    needs=SWEEP,
                    jobs=k,
                )
            )
        out.append(_gpu(job, seen))
        if seen.samples is not None:
            out.append(sample_cache_row(job, seen.samples, seen.room))
        out.append(remote_row(job, seen.wire, cluster=seen.cluster, workers=workers))
    if job.bottleneck == "fetch" and "fetch" not in job.unknown:
        files = seen.files or {}
        if files.get("applies") is not None:
            out.append(_file_cache(job, files))
            return out
        local = replace(rates, latency_s=0.0, bandwidth=1e12)
        tiers = predict(local, base)  # from the second epoch: the first reads storage
        out.append(option("cache", measured, tiers, needs=EDIT, eligible=False, kind="tiers"))
    return out


def _file_cache(job: Job, files: dict[str, Any]) -> Option:
    """The node cache for a dataset that opens its files itself: every listed file kept on
    the node from the second epoch, or why it cannot apply."""
    if not files.get("applies"):
        return option("cache", job.measured, unpriced="files", kind="files", why=files.get("why"))
    full = predict(job.rates, replace(job.base, cache=1.0))
    # every file held: the search's recommendation holds what the machine has room for
    config = {"kwargs": {"cache": 1.0}}
    return option("cache", job.measured, full, config=config, eligible=False, kind="files")


def _lean(job: Job, probe: dict[str, Any] | None) -> Option:
    """unstall's lean uint8 pipeline, priced by its CPU per sample against the job's own
    ``dataset[i]``, both timed side by side on the job's own JPEGs: a config at the job's
    own worker count (where it was priced) for a torchvision pipeline unstall runs as its
    own, else an edit of the script's dataset."""
    adapt = (probe or {}).get("adapt")
    config = {"kwargs": {"num_workers": job.base.workers, "prep": "lean"}} if adapt else None
    facts: dict[str, Any] = {"adapt": adapt} if adapt else {}
    if probe and probe.get("adapt_refused"):
        facts["refused"] = probe["adapt_refused"]
    needs = None if adapt else EDIT
    if not probe:
        return option("lean", job.measured, needs=needs, unpriced="no_jpegs", **facts)
    rates = job.rates
    ratio = probe["lean_cpu_s"] / probe["own_cpu_s"]
    lean = replace(rates, prep_cpu_s=rates.prep_cpu_s * ratio)
    facts["worker_cpu_ms_per_sample"] = {
        "now": round(rates.prep_cpu_s * 1e3, 3),
        "lean": round(rates.prep_cpu_s * ratio * 1e3, 3),
    }
    facts["probe"] = {k: round(v, 6) if isinstance(v, float) else v for k, v in probe.items()}
    return option(
        "lean", job.measured, predict(lean, job.base), config=config, needs=needs, **facts
    )


#: Whether the GPU stage's engine timed alone (`unstall.gpu.gpu_prep_rate`) stands for what
#: the loader gets from it. Not at present: on an H200 (`bench train`, 2026-11-29) the engine
#: alone ran several times faster than `prep="gpu"` delivered, and the GPU variants delivered
#: less than lean batches; the option is listed with the engine's rate, not priced, until
#: `bench train`'s ``gpu_stage`` shows the loader keeping the engine's rate.
GPU_STAGE_PRICED = False


def _gpu(job: Job, seen: Seen) -> Option:
    """GPU decode (`prep="auto"|"gpu"|"hybrid"`): priced where the GPU stage's rate was
    measured on the job's files on this machine (`unstall.gpu.gpu_prep_rate`) and that rate
    stands for the loader's (`GPU_STAGE_PRICED`): the CPU workers' rate as measured plus the
    GPU stage's, capped by what else limits the job (its model's rate G, fetch, the loop);
    else listed with what it lacks or why, never guessed. A recognized torchvision dataset
    takes it as a config, unedited."""
    adapt = (seen.lean or {}).get("adapt")
    config = {"kwargs": {"prep": "auto"}} if adapt else None
    facts = {"decoder": seen.decoder, **({"adapt": adapt} if adapt else {})}
    needs = None if adapt else EDIT
    probe = seen.gpu
    measured = seen.cuda and seen.decoder is not None and probe and probe.get("gpu_per_s")
    if measured and not GPU_STAGE_PRICED:
        return option(
            "gpu", job.measured, config=config, needs=needs, unpriced="stage_short",
            probe=probe, **facts,
        )  # fmt: skip
    if measured:
        cap = predict(replace(job.rates, prep_cpu_s=0.0), job.base)
        price = min(cap.samples_per_s, job.measured + probe["gpu_per_s"])
        return option(
            "gpu",
            job.measured,
            price,
            config=config,
            needs=needs,
            probe=probe,
            bound=cap.bound,
            **facts,
        )
    why = "no_cuda" if not seen.cuda else "no_decoder" if seen.decoder is None else "no_gpu_files"
    return option("gpu", job.measured, config=config, needs=needs, unpriced=why, **facts)
