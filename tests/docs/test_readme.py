"""The README as a newcomer reads it: short, its terms defined before they are used, and its
two commands (install, then the developers' test command) runnable in order in one clone.

The two commands once shared `.venv`: the first put the index's torch there (`2.13.0+cpu`),
the second's `pip --isolated install torch==2.13.0 torchvision==0.28.0` kept it (it satisfies
``==2.13.0``) and added PyPI's CUDA torchvision beside it, which does not import (`operator
torchvision::nms does not exist`). The checks below hold the mechanism that prevents it: the
test command makes a virtual environment no other command of the README or docs installs into,
takes torch and torchvision in one pip call from one index, and imports torchvision before the
suite runs.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from tests.docs.markdown_blocks import ROOT, all_blocks, blocks

README = ROOT / "README.md"
MAX_LINES = 150
#: (term, a pattern of its use, a pattern of the sentence that defines it). The README may
#: leave a term out; where it uses one, the first use is in or after its definition.
TERMS = [
    ("data stall", r"data stall", r"\*\*data stalls\*\* in PyTorch training: the time your GPU"),
    ("G", r"\bG\b", r"the model's own rate, called \*\*G\*\*"),
    ("prep", r"\bprep\b", r"\*prep\*: decoding and augmenting"),
    ("fetch", r"\bfetch\b", r"\*fetch\*: reading from storage"),
    ("C/N", r"C/N", r"a cache of C items out of a dataset of N"),
    ("cache=", r"\bcache=", r"`cache=`: a cache of read files in shared memory"),
    ("lean", r"\blean\b", r'`prep="lean"`: for a torchvision'),
    ("GPU prep", r'prep="gpu"|\bGPU prep\b', r'`prep="gpu"` decodes on\s+the GPU'),
    ("hybrid", r"\bhybrid\b", r'`prep="hybrid"` splits the work'),
    ("remote", r"\bremote=", r"`remote=`: Ray actors on other machines"),
    ("shards", r"\bshards\b", r"\*Shards\* are files that each pack many samples"),
    (
        "tar/MDS shards",
        r"\bMDS\b|\btar shards\b",
        r"\(webdataset's tar shards, Mosaic Streaming's MDS",
    ),
    (
        "coordinated group",
        r"\bcoordinated group\b",
        r"a \*coordinated group\* is a sweep's jobs on one node, reading the same data",
    ),
    ("LRU", r"\bLRU\b", r"(?!)"),
    ("zero-copy", r"zero-copy", r"(?!)"),  # not defined in the README: not to be used there
    ("differential method", r"differential", r"(?!)"),
    ("whole-batch fetching", r"whole-batch", r"(?!)"),
    ("no-eviction", r"no-eviction", r"(?!)"),
]


def _text() -> str:
    return README.read_text()


def test_readme_is_under_150_lines():
    lines = _text().splitlines()
    assert len(lines) < MAX_LINES, len(lines)


def test_no_term_is_used_before_its_definition():
    text = _text()
    for term, use, definition in TERMS:
        # a space in a pattern matches any run of white space (the README wraps its lines)
        use, definition = (p.replace(" ", r"\s+") for p in (use, definition))
        first = re.search(use, text)
        if first is None:
            continue  # not used: nothing to define
        defined = re.search(definition, text)
        assert defined, f"{term!r} is used (at {_line(text, first.start())}) but never defined"
        assert first.start() >= defined.start(), (
            f"{term!r} is used at line {_line(text, first.start())}, before its definition at "
            f"line {_line(text, defined.start())}"
        )


def test_readme_leads_in_the_order_a_user_works():
    """Install, `unstall run`, `unstall analyze`, `unstall run --config`, then the measured
    rows; the developers' test command last."""
    heads = re.findall(r"^## (.+)$", _text(), flags=re.M)
    order = ["1. Install", "2. See where", "3. Find out why", "4. Apply it", "Measured"]
    found = [next(i for i, h in enumerate(heads) if h.startswith(o)) for o in order]
    assert found == sorted(found), heads
    assert heads[-1].startswith("For developers"), heads


def _commands() -> tuple[list[str], list[str]]:
    """The install command (the README's first shell block) and the developers' test command
    (its last), each as its list of `&&`-separated steps."""
    shell = [b for b in blocks(README) if b.lang == "bash"]

    def steps(code: str) -> list[str]:
        return [s.strip() for line in code.splitlines() for s in line.split("&&") if s.strip()]

    return steps(shell[0].code), steps(shell[-1].code)


def _venv(steps: list[str]) -> str:
    made = [shlex.split(s)[-1] for s in steps if s.startswith("python3 -m venv ")]
    assert len(made) == 1, steps
    assert f". {made[0]}/bin/activate" in steps, steps
    return made[0]


def test_the_install_command_clones_and_takes_any_torch():
    install, _ = _commands()
    assert install[0].startswith("git clone "), install
    assert "pip install -e ." in install and install[-1] == "unstall demo", install
    # no pin: pip keeps a torch the environment has, or takes the index's (CPU or CUDA)
    assert not any("torch==" in s for s in install), install


def test_the_test_command_cannot_reuse_a_torch_that_does_not_match_its_torchvision():
    install, test = _commands()
    venv = _venv(test)
    assert venv != _venv(install)
    # torch and torchvision in one pip call, pinned, from one index (PyPI), before the extras
    pair = [s for s in test if "torchvision==" in s]
    assert len(pair) == 1 and pair[0].startswith("pip --isolated install "), test
    pinned = shlex.split(pair[0])[3:]
    assert sorted(p.split("==")[0] for p in pinned) == ["torch", "torchvision"], pinned
    extras = test.index('pip install -e ".[test]"')
    checked = test.index('python -c "import torchvision"')
    first_pytest = next(i for i, s in enumerate(test) if s.startswith("pytest"))
    assert test.index(pair[0]) < extras < checked < first_pytest, test
    # no other command of the README or the docs installs into that environment
    for block in all_blocks():
        if block.lang in ("bash", "sh", "shell") and venv in block.code:
            assert block.path == README and block.code.strip() == " && ".join(test), block.id
    # CI runs the same steps, in the same order
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    expected = [s.replace("pip --isolated install ", "pip --isolated install -q ") for s in test]
    quiet = 'pip install -q -e ".[test]"'
    expected = [s.replace('pip install -e ".[test]"', quiet) for s in expected]
    expected = [s.replace(". .venv-dev/bin/activate", f". {venv}/bin/activate") for s in expected]
    at = [_ci_line(ci, s) for s in expected]
    assert at == sorted(at), list(zip(expected, at, strict=True))


def test_getting_started_installs_as_the_readme_does():
    install, _ = _commands()
    page = [b for b in blocks(ROOT / "docs" / "getting-started.md") if b.lang == "bash"]
    assert any(b.code.strip() == "\n".join(_lines(install)) for b in page), [b.code for b in page]


def _lines(install: list[str]) -> list[str]:
    """The install block as the README writes it: the clone line, then the rest joined."""
    return [f"{install[0]} && {install[1]}", " && ".join(install[2:])]


def _ci_line(ci: list[str], step: str) -> int:
    for i, line in enumerate(ci):
        if line.split(" #", 1)[0].strip() == step:
            return i
    raise AssertionError(f".ci/run does not run `{step}`")


def _line(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def test_readme_links_reach_the_new_pages():
    text = _text()
    for page in ("docs/remedies.md", "docs/supported.md", "docs/faq.md", "docs/comparison.md"):
        assert f"]({page})" in text, page
    assert Path(ROOT / "CHANGELOG.md").is_file()
