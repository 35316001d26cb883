"""The summary of `unstall run`: rows named by rank, loaders that took no batch folded."""

from __future__ import annotations

from unstall.launch.report import fold, render


def record(number: int, dataset_id: int, batches: int, **extra) -> dict:
    return {
        "loader": number,
        "dataset": "Points",
        "batches": batches,
        "samples": 32 * batches,
        "epochs_completed": 2 if batches else 0,
        "batches_per_epoch": [batches // 2, batches // 2] if batches else [],
        "wait_s": 0.5,
        "wait_share": 0.25,
        "fetch_ms_per_batch": None,
        "prep_ms_per_batch": 3.0,
        "samples_per_s": 1000.0,
        "_dataset_id": dataset_id,
        **extra,
    }


def test_loaders_without_batches_are_folded_as_replaced_or_unused():
    used, folded = fold([record(0, 7, 0), record(1, 7, 8), record(2, 9, 0)])
    assert [r["loader"] for r in used] == [1] and "_dataset_id" not in used[0]
    assert folded == [
        {"loader": 0, "dataset": "Points", "why": "replaced"},  # its dataset went on in #1
        {"loader": 2, "dataset": "Points", "why": "unused"},
    ]


def test_rows_are_named_by_rank_and_folded_loaders_are_one_line():
    docs = []
    for rank in (0, 1):
        used, folded = fold([record(0, 7, 0), record(1, 7, 8)])
        docs.append({"pid": 100 + rank, "rank": rank, "loaders": used, "folded": folded})
    text = render(docs)
    rows = [line for line in text.splitlines() if line.startswith(("rank", "pid"))]
    assert [r.split()[:2] for r in rows] == [["rank", "0"], ["rank", "1"]]
    assert all("2 x 4" in r and "25.0 %" in r for r in rows)
    assert "not shown: 2 loader(s) that handed out no batch (2 replaced" in text
    assert "pid 100" not in text


def test_only_unused_loaders_say_so():
    used, folded = fold([record(0, 7, 0)])
    text = render([{"pid": 5, "rank": None, "loaders": used, "folded": folded}])
    assert text == (
        "unstall run: the program made 1 DataLoader(s) but took no batch from any, "
        "so there is no stall to report\n"
    )
