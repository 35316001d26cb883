"""make_dataset: same bytes for any worker count, realistic sizes, ImageFolder layout, resume."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

import unstall
from unstall.data.synthetic import MANIFEST, ensure_demo_dataset, image_key, make_dataset
from unstall.errors import MissingKeyError
from unstall.pipeline import image_size
from unstall.stores import Store

IMAGES, CLASSES = 24, 4


def _hashes(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*.jpg"))
    }


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("synthetic") / "ds"
    info = make_dataset(root, images=IMAGES, classes=CLASSES, seed=0, workers=2, progress=False)
    assert (info.written, info.skipped, info.images) == (IMAGES, 0, IMAGES)
    return root


def test_same_bytes_for_any_worker_count(dataset: Path, tmp_path: Path) -> None:
    make_dataset(tmp_path, images=IMAGES, classes=CLASSES, seed=0, workers=1, progress=False)
    assert _hashes(tmp_path) == _hashes(dataset)
    other = tmp_path / "seed1"
    make_dataset(other, images=IMAGES, classes=CLASSES, seed=1, workers=3, progress=False)
    assert set(_hashes(other).values()).isdisjoint(_hashes(dataset).values())


def test_sizes_are_photo_like(dataset: Path) -> None:
    sizes = [p.stat().st_size for p in dataset.rglob("*.jpg")]
    assert len(sizes) == IMAGES
    assert 65_000 <= sum(sizes) / len(sizes) <= 85_000
    assert min(sizes) > 45_000 and max(sizes) < 110_000
    dims = {image_size(p.read_bytes()) for p in dataset.rglob("*.jpg")}
    assert dims <= {(500, 375), (375, 500), (500, 333)} and (500, 375) in dims


def test_imagefolder_layout_and_labels(dataset: Path) -> None:
    keys = sorted(p.relative_to(dataset).as_posix() for p in dataset.rglob("*.jpg"))
    assert keys == sorted(image_key(i, images=IMAGES, classes=CLASSES) for i in range(IMAGES))
    assert image_key(5, images=IMAGES, classes=CLASSES) == "class_001/img_000005.jpg"
    folder = unstall.ImageFolder(dataset, raw=True)
    assert folder.classes == ["class_000", "class_001", "class_002", "class_003"]
    assert len(folder) == IMAGES
    for i in range(IMAGES):
        index = int(folder.key(i).rsplit("_", 1)[1].split(".")[0])
        assert folder.labels[i] == index % CLASSES
    x, label = unstall.ImageFolder(dataset)[0]  # default transform: ImagePipeline
    assert x.shape == (3, 224, 224) and label == 0


def test_rerun_skips_and_mismatch_names_parameter(dataset: Path) -> None:
    before = _hashes(dataset)
    info = make_dataset(dataset, images=IMAGES, classes=CLASSES, seed=0, progress=False)
    assert (info.written, info.skipped) == (0, IMAGES)
    assert 65_000 <= info.mean_bytes <= 85_000 and info.sized == IMAGES
    assert _hashes(dataset) == before
    manifest = json.loads((dataset / MANIFEST).read_text())
    assert manifest["seed"] == 0 and manifest["images"] == IMAGES
    with pytest.raises(ValueError, match=r"made with seed=0, not seed=1"):
        make_dataset(dataset, images=IMAGES, classes=CLASSES, seed=1, progress=False)
    with pytest.raises(ValueError, match=r"made with quality=90, not quality=80"):
        make_dataset(dataset, images=IMAGES, classes=CLASSES, quality=80, progress=False)


def test_resume_writes_only_missing(tmp_path: Path, dataset: Path) -> None:
    make_dataset(tmp_path, images=IMAGES, classes=CLASSES, seed=0, workers=1, progress=False)
    missing = sorted(tmp_path.rglob("*.jpg"))[:5]
    for path in missing:
        path.unlink()
    info = make_dataset(tmp_path, images=IMAGES, classes=CLASSES, seed=0, progress=False)
    assert (info.written, info.skipped) == (5, IMAGES - 5)
    assert _hashes(tmp_path) == _hashes(dataset)


def test_corrupt_file_names_key_in_sample_error(tmp_path: Path) -> None:
    make_dataset(tmp_path, images=4, classes=2, seed=0, progress=False)
    (tmp_path / "class_001" / "img_000003.jpg").write_bytes(b"\xff\xd8\xff\xe0 broken")
    folder = unstall.ImageFolder(tmp_path)
    index = [folder.key(i) for i in range(len(folder))].index("class_001/img_000003.jpg")
    with pytest.raises(unstall.SampleError, match=r"class_001/img_000003\.jpg") as info:
        folder[index]
    assert info.value.key == "class_001/img_000003.jpg"


@pytest.mark.parametrize(
    ("option", "value"), [("images", 0), ("classes", 0), ("seed", -1), ("quality", 101)]
)
def test_bad_parameters_are_named(tmp_path: Path, option: str, value: int) -> None:
    params = {"images": 4, "classes": 2, "seed": 0, "quality": 90, option: value}
    with pytest.raises(ValueError, match=f"{option}={value}"):
        make_dataset(tmp_path, progress=False, **params)


class MemoryStore(Store):
    """A dict-backed store: make_dataset must write through the Store interface only."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}

    @property
    def url(self) -> str:
        return "memory://test"

    def _get(self, key: str) -> bytes:
        if key not in self.objects:
            raise MissingKeyError(f"no {key!r}", key=key)
        return self.objects[key]

    def _list(self, prefix: str) -> list[str]:
        return [k for k in self.objects if k.startswith(prefix)]

    def _put(self, key: str, data: bytes) -> None:
        self.objects[key] = data


def test_writes_through_any_store(dataset: Path) -> None:
    store = MemoryStore()
    info = make_dataset(store, images=IMAGES, classes=CLASSES, seed=0, workers=1, progress=False)
    assert info.root == "memory://test" and info.written == IMAGES
    assert MANIFEST in store.objects
    expected = _hashes(dataset)
    got = {k: hashlib.sha256(v).hexdigest() for k, v in store.objects.items() if k != MANIFEST}
    assert got == expected


def test_ensure_demo_dataset_uses_cache_dir_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("UNSTALL_CACHE_DIR", str(tmp_path))
    path = ensure_demo_dataset(images=6, classes=2, seed=3, progress=False)
    assert path == tmp_path / "datasets" / "synthetic-6x2-seed3"
    assert len(list(path.rglob("*.jpg"))) == 6
    mtimes = {p: p.stat().st_mtime_ns for p in path.rglob("*.jpg")}
    assert ensure_demo_dataset(images=6, classes=2, seed=3, progress=False) == path
    assert {p: p.stat().st_mtime_ns for p in path.rglob("*.jpg")} == mtimes
