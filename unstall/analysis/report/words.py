"""The words of the report's options: what each remedy is, how it is applied, why one has
no price, why one priced higher is not the recommendation. The pricing
(`unstall.analysis.recommend`) hands typed `Option` values and keys; every sentence a user
reads about them is written here, once, and the JSON report's ``remedies`` rows are
`row` of each option (the terminal and HTML pages show those rows).
"""

from __future__ import annotations

from typing import Any

from unstall.analysis.recommend.auto import MARGIN
from unstall.analysis.recommend.option import CLUSTER, GAIN, SWEEP, Option
from unstall.analysis.recommend.remote import MAX_WORKERS
from unstall.loader.autotune.policy import GAIN as TUNER_GAIN

#: How a config reaches the unchanged script.
BY_CONFIG = "unstall run --config FILE, FILE holding {config} (no edit of the script)"
#: What a change of dataset in the script means.
BY_EDIT = "a change of dataset in the script (a few lines)"
#: Why a remedy that needs what the job lacks is priced, not chosen (`Option.needs`).
NEEDS = {
    CLUSTER: "remote CPUs are a Ray cluster's: the analysis cannot see whether it has them "
    "free, so the remedy is priced, not chosen",
    SWEEP: "it prices {jobs} jobs of a sweep on this node reading the same data; this job "
    "runs alone",
}
#: Why an option has no price (`Option.unpriced`), and the key of the row that says it.
UNPRICED = {
    "no_jpegs": (
        "not_measured",
        "the dataset lists no JPEG files (torchvision's `samples`, unstall's keys over local "
        "files) to time the pipeline on",
    ),
    "no_gpu_files": (
        "not_measured",
        "not measured: {decoder} is importable, but the job lists no JPEG files to time it on",
    ),
    "no_cuda": ("not_measured", "not measured: no CUDA device on this machine"),
    "stage_short": (
        "not_applicable",
        "not priced: {decoder} prepares {probe[gpu_per_s]:,.0f} images/s alone on these files, "
        "but the loader's GPU stage delivers far less than its engine (measured on an H200: "
        "below lean batches); use prep='lean' (or the CPU workers) on a GPU for now",
    ),
    "no_decoder": (
        "not_measured",
        "not measured: no GPU decoder installed (pip install 'unstall[dali]')",
    ),
    "files": ("not_applicable", "{why}"),
    "plan_refused": (
        "not_applicable",
        "prep='lean' leaves this detection pipeline as it is: {why}",
    ),
    "not_deterministic": (
        "not_applicable",
        "its samples cannot be cached whole: the {check!r} check failed: {why}",
    ),
    "no_room": ("not_applicable", "{why}"),
    "zero_time": ("not_applicable", "the job's measured time per sample is zero"),
    "local_reach": (
        "not_applicable",
        "no remote worker pays: the local workers already reach the {cap_words}",
    ),
    "unknown": ("not_measured", "not priced: {reason}"),
    "short": (
        "not_measured",
        "not priced: the measured window lasted {window_s:.1f} s, less than the {lost_s:.1f} s "
        "its settling would lose (measure longer: without --quick, or a larger --min-seconds)",
    ),
}
#: What each cap the remote workers cannot lift is.
CAPS = {
    "compute": "model's own rate (G)",
    "fetch": "storage's bandwidth",
    "main": "training loop's own thread (hand-off and receive)",
    "process": "cores the training process itself uses",
}
#: The ``auto`` row's verdict (`auto.auto_row`'s ``why``).
AUTO_WHY = {
    "fragile": f"within {MARGIN:.0%} of the best fixed setting, which is fragile: {{fragile}}",
    "not_fragile": "a fixed count is not fragile on this job: the fixed recommendation stands",
    "below_fixed": f"more than {MARGIN:.0%} below the best fixed setting's prediction (or the "
    "job's)",
    "below_job": "predicted slower than the job as it is",
}


def what(o: Option) -> str:
    """What option ``o`` changes, in one phrase."""
    f = o.facts
    if o.remedy == "lean":
        if f.get("adapt"):
            return (
                f"unstall's lean pipeline in place of the {f['adapt']}'s torchvision transform "
                "(the same ops and parameters, uint8 on the CPU workers, normalized on the "
                "device or at the hand-off; the same float32 batches)"
            )
        return (
            "unstall.ImageFolder(root, transform=ImagePipeline(output='uint8')) with "
            "DataLoader(device='cuda'): decode at reduced scale + crop + flip on the CPU, "
            "normalize on the GPU"
        )
    if o.remedy == "detection":
        return (
            "the dataset's torchvision detection pipeline run as unstall's plan (the same ops "
            "and draws: boxes moved first, each output pixel made once from the decoded "
            "image, colours at output size, the JPEG decoded at a reduced scale where the "
            "output allows; the same batches)" + (f", in {f['adapt']}" if f.get("adapt") else "")
        )
    if o.remedy == "coordinate":
        return (
            f"if {f['jobs']} jobs on this node read the same data (a sweep): "
            "DataLoader(coordinate=True) in each prepares every batch once for all"
        )
    if o.remedy == "gpu":
        return (
            "decode and augment on the GPU beside the CPU workers: unstall.ImageFolder + "
            "DataLoader(device='cuda', prep='auto' or 'hybrid')"
        )
    if o.remedy == "cache" and f.get("kind") == "files":
        return (
            "keep the files the dataset opens in the node cache (whole files, keyed by path "
            "and versioned by size, mtime and inode): from the second epoch storage is no "
            "longer read"
        )
    if o.remedy == "cache":
        return (
            "keep the samples on this node: unstall.Cache(disk=...) (local disk tier, on by "
            "default for s3://) or peers=unstall.Peers() across nodes; from the second epoch "
            "storage is no longer read"
        )
    if o.remedy == "samples":
        return (
            "keep each prepared sample on the node (unstall.Cache(size, hold='samples'), the "
            "preparation checked deterministic on the job's own samples): from the second "
            "epoch a sample is read back instead of prepared again"
        )
    if o.remedy == "remote":
        n = f.get("remote_workers", "N")
        return (
            f"prepare batches on other machines too: {n} remote CPUs as Ray actors beside the "
            f"local workers (DataLoader(remote=unstall.Remote(workers={n})))"
        )
    if o.remedy == "auto":
        return (
            "DataLoader(num_workers='auto'): the loader sizes its pool while the job runs "
            f"(starts at {f.get('start', 1)}, grows while the loop waits and cores are free, "
            "shrinks when workers idle, keeps watching)"
        )
    return o.remedy


def applies(o: Option) -> str:
    """How option ``o`` reaches the job: a config, an edit, or what else it needs."""
    config = _config_text(o)
    if o.remedy == "remote":
        cluster = o.facts.get("cluster")
        where = (
            f"the Ray cluster at RAY_ADDRESS={cluster}"
            if cluster
            else 'a Ray cluster, named by RAY_ADDRESS or "address" in the remote entry (none '
            "was named where analyze ran)"
        )
        n = o.facts.get("remote_workers", "N")
        return (
            "unstall run --config FILE, FILE holding the config's remote entry (no edit of the "
            f"script); needs {where} with {n} free CPUs, and pip install 'unstall[ray]' on the "
            "trainer and the cluster's nodes"
        )
    if o.remedy == "coordinate":
        return "each job: " + BY_CONFIG.format(config='{"kwargs": {"coordinate": "SWEEP_NAME"}}')
    if o.remedy == "gpu" and o.facts.get("adapt"):
        return BY_CONFIG.format(config=config)[:-1] + (
            f": the {o.facts['adapt']}'s RandomResizedCrop + flip go to the GPU stage)"
        )
    if o.remedy == "cache" and o.facts.get("kind") == "tiers":
        return "unstall.ImageFolder/FileDataset with cache=unstall.Cache(...)"
    if o.remedy == "cache" and o.config:
        return BY_CONFIG.format(config='{"kwargs": {"cache": 1.0}} or a size')
    if o.config is not None:
        return BY_CONFIG.format(config=config)
    return BY_EDIT


def row(o: Option, chosen: str | None = None) -> dict[str, Any]:
    """Option ``o`` as the JSON report's row: its words, price, config and facts;
    ``recommended`` where it is the ``chosen`` remedy (the recommendation's; "" for the
    loader setting), or without one, where its own rule would have it."""
    out: dict[str, Any] = {
        "remedy": o.remedy,
        "what": what(o),
        "predicted_samples_per_s": o.predicted,
        "predicted_speedup": o.speedup,
        "applies": applies(o),
    }
    if o.config is not None:
        out["config"] = dict(o.config)
    if o.bound is not None:
        out["bound"] = o.bound
    facts = dict(o.facts)
    if o.unpriced is not None:
        key, text = UNPRICED[o.unpriced]
        out[key] = text.format(**_fill(o))
        out["unpriced"] = o.unpriced
    if o.remedy == "lean" and facts.get("refused"):
        out["not_applied"] = f"prep='lean' leaves this dataset as it is: {facts.pop('refused')}"
    if o.remedy == "remote" and o.predicted is not None:
        out["transfer"] = _transfer(facts.pop("transfer"))
        out["assumed"] = (
            "each remote CPU as fast as this node's (the job's measured CPU per sample and "
            "storage time per batch); the network carries the bytes/s given; Ray's own cost "
            "per object is not included"
        )
        if "wanted" in facts:
            wanted = facts.pop("wanted")
            out["not_enough"] = f"{wanted} workers would reach the cap; priced at {MAX_WORKERS}"
    if o.remedy in ("remote", "auto"):
        out["recommended"] = (
            o.remedy == chosen if chosen is not None else o.eligible and o.needs is None
        )
    if o.needs in (CLUSTER, SWEEP) and o.predicted is not None:
        out["why_not_recommended"] = NEEDS[o.needs].format(jobs=facts.get("jobs"))
    if o.remedy == "auto" and facts.get("settling", {}).get("undone"):
        facts["settling"] = {
            **facts["settling"],
            "undone": undone_text(facts["settling"]["undone"]),
        }
    if o.remedy == "auto" and o.predicted is not None:
        out["why"] = AUTO_WHY[facts["why"]].format(fragile="; ".join(fragile_text(facts)))
        out["fragile"] = fragile_text(facts)
        facts.pop("why")
        facts.pop("fragile")
    if o.remedy == "samples" and o.predicted is not None:
        out["from_epoch"] = facts.pop("from_epoch")
        out["priced"] = (
            "from the second epoch (the first prepares and stores every sample): a cached "
            "sample's read and collate timed on the job's own samples as a worker meets "
            "them (forked processes, the segment's pages fresh), the training process's "
            "loop and receive, and torch's in-order delivery at the batch times' spread"
        )
    for k in ("adapt", "kind", "jobs", "why", "cap", "reason", "window_s", "lost_s", "start"):
        facts.pop(k, None)
    out.update(facts)
    return out


def not_chosen(rec: dict[str, Any]) -> str:
    """The one sentence that says why the options priced above the recommendation are not
    it ("": none is)."""
    parts = [
        f"{_name(r)} ({r['predicted_speedup']}x) {_why_not(r)}" for r in rec.get("not_chosen") or []
    ]
    return "Priced higher but not recommended: " + "; ".join(parts) + "." if parts else ""


def _name(r: dict[str, Any]) -> str:
    names = {"remote": "remote workers", "auto": "num_workers='auto'", "samples": "sample cache"}
    return names.get(r["remedy"], r["remedy"])


def _why_not(r: dict[str, Any]) -> str:
    """Why one option of ``not_chosen`` is not the recommendation, as a clause."""
    reason = r["reason"]
    if reason == CLUSTER and r.get("cluster"):
        return (
            f"would run on free CPUs of the Ray cluster at {r['cluster']}, which analyze cannot see"
        )
    if reason == CLUSTER:
        return "would run on a Ray cluster, and none was named where analyze ran (RAY_ADDRESS)"
    if reason == SWEEP:
        return f"is priced for {r.get('jobs')} jobs of a sweep reading the same data on this node"
    if reason == "gain":
        return f"is under the {GAIN:g}x a change must be predicted to gain"
    if r["remedy"] == "auto":
        return "is not recommended: " + AUTO_WHY[r["why"]].split(":")[0]
    if r["remedy"] == "cache" and r.get("kind") == "files":
        return "holds every file, and the recommendation holds what this machine has room for"
    if r["remedy"] == "cache":
        return "is priced from the second epoch on, with unstall's dataset in the script"
    return "is not taken by its own rule"


def recommendation_lines(rec: dict[str, Any]) -> list[str]:
    """The recommendation as the terminal and the page say it: what to run and its price, how
    to apply it, what it replaces, and why the options priced above it are not it."""
    if not rec.get("changed", True):
        lines = [f"Recommendation: keep the loader as it is: {rec.get('why_unchanged', '')}"]
    else:
        head = rec["what"] if rec.get("edit") else f"DataLoader({kwargs_text(rec['kwargs'])})"
        lines = [
            f"Recommendation: {head}: predicted {rec['predicted_samples_per_s']:,.0f} samples/s, "
            f"{rec['predicted_speedup']}x the {rec['predicted_current_samples_per_s']:,.0f}/s "
            f"predicted as it is (measured {rec['measured_samples_per_s']:,.0f}/s)"
        ]
        if rec.get("edit"):
            lines.append(
                f"  apply it: {rec['applies']}; the loader's own arguments "
                f"DataLoader({kwargs_text(rec['kwargs'])}) go with unstall run --config"
            )
        elif rec.get("applies"):
            lines.append(f"  apply it: {rec['applies']}")
    lines += [f"  cache: {rec[k]}" for k in ("cache_files", "cache_not_applied") if rec.get(k)]
    i = rec.get("instead")
    if i:
        why = f": {rec['auto']['why']}" if rec.get("auto") else ""
        lines.append(
            f"  instead of DataLoader({kwargs_text(i['kwargs'])}), predicted "
            f"{i['predicted_samples_per_s']:,.0f} samples/s{why}"
        )
    if rec.get("why_not_others"):
        lines.append(f"  {rec['why_not_others']}")
    return lines


def kwargs_text(kwargs: dict[str, Any]) -> str:
    """Loader arguments as a call writes them (``cache`` as ``unstall.Cache(...)``)."""
    return ", ".join(
        f"cache=unstall.Cache({_cache_args(v)})" if k == "cache" else f"{k}={v!r}"
        for k, v in kwargs.items()
    )


def _cache_args(v: Any) -> str:
    """A cache setting as ``unstall.Cache``'s arguments (a config's dict as keywords)."""
    if isinstance(v, dict):
        return ", ".join(f"{k}={x!r}" for k, x in v.items())
    return str(v)


def undone_text(undone: list[Any] | tuple[Any, ...]) -> str:
    """How the tuner's walk ended on a change it undid (`auto.Settling.undone`)."""
    kind, a, b = undone
    if kind == "grow":
        return (
            f"a grow to {a} would neither raise the rate {TUNER_GAIN:g}x nor halve the loop's "
            "wait: undone"
        )
    if kind == "shrink":
        return f"a shrink to {a} would make the loop wait: undone"
    return f"alternates between {a} and {b} workers"


def fragile_text(facts: dict[str, Any]) -> list[str]:
    """The ``auto`` row's reasons a fixed count is fragile, as sentences."""
    out = []
    for r in facts.get("fragile") or []:
        if r["why"] == "oversubscribed":
            share = r.get("runq")
            out.append(
                f"oversubscribed: the job asks {r['workers']} workers of {r['cores']} cores"
                + (f" (they waited for a core {share:.0%} of their time)" if share else "")
                + "; a fixed count is right for one machine only"
            )
        elif r["why"] == "ranks":
            out.append(
                f"{r['ranks']} ranks share this node: each fixed pool takes cores the others need"
            )
        elif r["why"] == "others":
            out.append(
                f"other processes kept {r['cores']:.1f} cores busy while it was measured: the "
                "cores left to the workers change"
            )
        else:
            out.append(
                f"the best fixed count is this machine's {r['workers']} cores: another machine "
                "needs another count"
            )
    return out


def _fill(o: Option) -> dict[str, Any]:
    """The facts an `UNPRICED` sentence is written from."""
    f = dict(o.facts)
    f.setdefault("why", "")
    f["cap_words"] = CAPS.get(f.get("cap", ""), f.get("cap", ""))
    return f


def _config_text(o: Option) -> str:
    import json

    return json.dumps(dict(o.config)) if o.config is not None else ""


def _transfer(t: dict[str, Any]) -> dict[str, Any]:
    """The remote row's transfer, with how it was measured (or why it was not)."""
    if not t.get("measured"):
        return {
            "measured": False,
            "why": "no batch of the job was seen to time the transfer on: priced without the "
            "trainer's receive cost (an upper bound)",
        }
    keep = ("measured", "bytes_per_sample", "receive_cpu_ms_per_sample", "network_mb_per_s")
    return {
        **{k: t[k] for k in keep},
        "how": f"one of the job's batches ({t['samples']} samples, {t['batch_bytes']:,} bytes as "
        f"unstall.remote ships it), its receive (the copy out of the object store) timed "
        f"{t['repeats']} times on this machine, the median",
    }
