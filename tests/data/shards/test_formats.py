"""The formats table and the hooks a format implements: a new format (JSON lines, written
here in the 20 lines docs/guide/shards.md's recipe asks for) reads through the loader and
`unstall index` like the built-in ones, with nothing else of unstall touched."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import unstall
from unstall.data.shards import (
    MDSShards,
    ParquetShards,
    ShardDataset,
    ShardFormat,
    ShardTable,
    TarShards,
)
from unstall.data.shards.index import ShardInfo
from unstall.data.shards.registry import DEFAULT, format_for, formats


class JsonLines(ShardDataset):
    """``.jsonl`` shards: a sample is one line, a JSON object of its fields."""

    kind = "jsonl"
    suffixes = (".jsonl",)
    default_image = "text"
    default_label = "label"

    def build_index(self, infos: list[ShardInfo], directory: str) -> list[ShardTable]:
        tables = []
        for info in infos:
            data = Path(self.location.path(info.key)).read_bytes()
            ends = np.flatnonzero(np.frombuffer(data, np.uint8) == ord("\n")) + 1
            spans = np.stack([np.r_[0, ends[:-1]], ends], axis=1)
            keys = [str(n) for n in range(len(ends))]
            tables.append(ShardTable(keys=keys, spans=spans, fields=["text", "label"]))
        return tables

    def fields(self, index: int, raw: bytes) -> dict[str, Any]:
        return json.loads(raw)


def write_jsonl(root: Path, shards: int, per_shard: int) -> Path:
    root.mkdir()
    for s in range(shards):
        rows = [{"text": f"sample {s * per_shard + j}", "label": j % 3} for j in range(per_shard)]
        (root / f"part-{s}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def test_the_table_holds_every_format_by_kind_and_guesses_by_suffix():
    assert {"tar": TarShards, "mds": MDSShards, "parquet": ParquetShards} == formats()
    assert all(issubclass(cls, ShardFormat) for cls in formats().values())
    assert format_for("s3://b/train-{000000..000099}.tar") == "tar"
    assert format_for("/data/imagenet-mds/index.json") == "mds"
    assert format_for("s3://b/x/shard.00001.mds") == "mds"
    assert format_for("/data/hf/train-{00000..00009}.parquet/") == "parquet"
    assert format_for("s3://bucket/prefix/") == DEFAULT == "tar"


def test_a_format_must_implement_its_two_hooks():
    class Half(ShardDataset):
        kind, suffixes = "half", (".half",)

        def fields(self, index: int, raw: bytes) -> dict[str, Any]:
            return {}

    with pytest.raises(TypeError, match="build_index"):
        Half("/nowhere")


def ids(batch: list[tuple[str, int]]) -> list[tuple[int, int]]:
    return [(int(text.split()[1]), label) for text, label in batch]


def test_a_new_format_loads_exactly_once_through_the_loader(tmp_path):
    root = write_jsonl(tmp_path / "lines", shards=3, per_shard=7)
    ds = JsonLines(str(root))
    assert len(ds) == 21 and ds[8] == ("sample 8", 1)
    assert ds.stats()["shards"]["format"] == "jsonl"
    loader = unstall.DataLoader(
        ds, batch_size=4, shuffle=True, num_workers=2, seed=0, collate_fn=ids
    )
    got = [pair for batch in loader for pair in batch]
    assert sorted(got) == [(n, (n % 7) % 3) for n in range(21)]
    assert [n for n, _ in got] != list(range(21))  # shuffled
    assert JsonLines(str(root), image=None)[3] == {"text": "sample 3", "label": 0}


def test_unstall_index_reads_the_table(tmp_path, monkeypatch, capsys):
    from unstall.cli import main

    root = write_jsonl(tmp_path / "lines", shards=2, per_shard=5)
    monkeypatch.setitem(formats(), "jsonl", JsonLines)
    assert format_for(f"{root}/part-{{0..1}}.jsonl") == "jsonl"
    assert main(["index", f"{root}/part-{{0..1}}.jsonl", "--local-only"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "2 jsonl shards, 10 samples indexed" in out and "2 read now" in out
    assert main(["index", str(root), "--format", "jsonl", "--local-only"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "2 jsonl shards, 10 samples indexed" in out and "2 indexed on this node" in out


def test_a_sample_that_fails_names_its_index_and_key(tmp_path):
    """Every failure of ``prepare`` is one `SampleError` naming the sample and its key."""
    from unstall.errors import SampleError

    root = tmp_path / "bad"
    root.mkdir()
    rows = ['{"text": "a", "label": 1}', "not json", '{"text": "c", "label": "x"}', '{"t": 1}']
    (root / "part-0.jsonl").write_text("\n".join(rows) + "\n")

    def boom(text: str) -> str:
        raise RuntimeError(f"cannot use {text!r}")

    cases = [
        ({}, 1, r"^cannot read sample 1 \(part-0\.jsonl:1\): JSONDecodeError: "),
        ({}, 2, r"^sample 2 \(part-0\.jsonl:2\): label 'x' is not an integer$"),
        ({}, 3, r"^sample 3 \(part-0\.jsonl:3\) has no field 'text'; it has t$"),
        ({"transform": boom}, 0, r"^cannot prepare sample 0 \(part-0\.jsonl:0\): RuntimeError: "),
    ]
    for options, index, message in cases:
        with pytest.raises(SampleError, match=message) as caught:
            JsonLines(str(root), **options)[index]
        assert caught.value.index == index and caught.value.key == f"part-0.jsonl:{index}"
