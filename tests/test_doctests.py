"""Every ``>>>`` example in calibtune's docstrings runs and prints what it shows (issue 11: public
functions carry a short example, run in CI). One test per module that has examples; modules
without any are not imported (that would only cost start-up time)."""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "calibtune"


def _modules_with_examples() -> list[str]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if ">>>" in path.read_text(encoding="utf-8"):
            parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
            out.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return out


MODULES = _modules_with_examples()


def test_examples_are_found() -> None:
    # the registry, the metric keys and the metrics carry examples; a broken scan finds none
    assert {"calibtune._registry", "calibtune.metrics.keys", "calibtune.metrics._calibration"} <= (
        set(MODULES)
    )


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_pass(name: str) -> None:
    module = importlib.import_module(name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    tests = [t for t in finder.find(module, name) if t.examples]
    assert tests, f"{name}: a '>>>' in the source but no docstring example found"
    for test in tests:
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{name}: {result.failed} of {result.attempted} examples failed"
