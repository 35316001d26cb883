"""``prep="lean"`` (and the GPU stage's values) on real torchvision datasets, in the loader."""

from __future__ import annotations

import pytest
import torch
import torchvision
import torchvision.transforms as T
from torch.utils.data import Subset

import unstall
from tests.adapt.solid import CLASSES, MEAN, STD, class_of, make_solid_folder
from unstall.adapt import Refusal, recognize
from unstall.adapt.folder import TorchvisionFolder


@pytest.fixture(scope="module")
def solid_folder(tmp_path_factory):
    return make_solid_folder(tmp_path_factory.mktemp("solid"))


TRAIN = T.Compose(
    [T.RandomResizedCrop(32), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)]
)


def _epoch(loader) -> tuple[list[int], list[int]]:
    labels, seen = [], []
    for images, target in loader:
        assert images.dtype == torch.float32 and images.shape[1:] == (3, 32, 32)
        labels += target.tolist()
        seen += [class_of(images[i, :, 0, 0].tolist()) for i in range(len(target))]
    return labels, seen


def test_lean_gives_the_scripts_batches_labels_and_order(solid_folder, capsys) -> None:
    dataset = torchvision.datasets.ImageFolder(str(solid_folder), transform=TRAIN)
    loader = unstall.DataLoader(dataset, batch_size=8, shuffle=True, num_workers=2, prep="lean")
    assert "prepared lean" in capsys.readouterr().err
    assert isinstance(loader.dataset, TorchvisionFolder)
    for _ in range(2):
        labels, seen = _epoch(loader)
        assert sorted(labels) == list(range(CLASSES))  # each sample exactly once
        assert seen == labels  # every image with its own label


def test_subset_and_target_transform_are_kept(solid_folder) -> None:
    base = torchvision.datasets.ImageFolder(
        str(solid_folder), transform=TRAIN, target_transform=lambda t: t + 100
    )
    subset = Subset(Subset(base, list(range(0, CLASSES, 2))), [0, 3, 5, 7, 11])
    loader = unstall.DataLoader(subset, batch_size=2, num_workers=0, prep="lean")
    assert loader.dataset.name == "Subset(Subset(ImageFolder))"
    labels, seen = _epoch(loader)
    assert labels == [100 + k for k in (0, 6, 10, 14, 22)]
    assert [s + 100 for s in seen] == labels


def test_validation_pipeline_and_uint8_output(solid_folder) -> None:
    val = T.Compose([T.Resize(40), T.CenterCrop(32), T.PILToTensor()])
    dataset = torchvision.datasets.ImageFolder(str(solid_folder), transform=val)
    loader = unstall.DataLoader(dataset, batch_size=16, num_workers=0, prep="lean")
    images, target = next(iter(loader))
    expected = torch.stack([dataset[i][0] for i in range(16)])
    assert images.dtype == torch.uint8 and images.shape == expected.shape
    assert (images.int() - expected.int()).abs().max() <= 2
    assert target.tolist() == list(range(16))


class Blur:
    """A transform of the script's own."""

    def __call__(self, image):
        return image


def test_an_unknown_op_leaves_the_dataset_as_it_is_and_says_which(solid_folder, capsys) -> None:
    tf = T.Compose([T.RandomResizedCrop(32), Blur(), T.ToTensor()])
    dataset = torchvision.datasets.ImageFolder(str(solid_folder), transform=tf)
    loader = unstall.DataLoader(dataset, batch_size=8, num_workers=0, prep="lean")
    err = capsys.readouterr().err
    assert "dataset left as it is: transform Blur is not a torchvision operation" in err
    assert loader.dataset is dataset and loader.prep == "cpu"
    assert next(iter(loader))[0].shape == (8, 3, 32, 32)


def test_an_iterable_dataset_under_a_lean_config_runs_as_it_is(capsys) -> None:
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(range(10))

    loader = unstall.DataLoader(Stream(), batch_size=5, prep="lean")
    assert "dataset left as it is: Stream is not a torchvision" in capsys.readouterr().err
    assert [b.tolist() for b in loader] == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]


def test_refusals_name_what_is_unknown(solid_folder) -> None:
    NEAREST = T.InterpolationMode.NEAREST

    class Mine(torchvision.datasets.ImageFolder):
        def __getitem__(self, index):
            return super().__getitem__(index)

    cases = {
        "has its own __getitem__": Mine(str(solid_folder), transform=TRAIN),
        "loads with": torchvision.datasets.ImageFolder(
            str(solid_folder), transform=TRAIN, loader=lambda p: p
        ),
        "interpolation=nearest": torchvision.datasets.ImageFolder(
            str(solid_folder),
            transform=T.Compose([T.Resize(32, interpolation=NEAREST), T.ToTensor()]),
        ),
        "ends on PIL images": torchvision.datasets.ImageFolder(
            str(solid_folder), transform=T.RandomResizedCrop(32)
        ),
        "is not a torchvision DatasetFolder": list(range(3)),
    }  # fmt: skip
    for words, dataset in cases.items():
        found = recognize(dataset)
        assert isinstance(found, Refusal) and words in found.reason, (words, found)


def test_gpu_stage_on_the_cpu_engine(solid_folder) -> None:
    """prep="gpu" without a GPU: the GPU stage's CPU engine, same batches and labels."""
    dataset = torchvision.datasets.ImageFolder(str(solid_folder), transform=TRAIN)
    loader = unstall.DataLoader(dataset, batch_size=8, shuffle=True, num_workers=0, prep="gpu")
    assert loader.prep in ("gpu", "hybrid")
    labels, seen = _epoch(loader)
    assert sorted(labels) == list(range(CLASSES)) and seen == labels
