"""The lazy package faces of the lower layers cost nothing to import: ``calibtune.data`` loads
none of its modules (torch) until a name is used, and the storage owner's pyarrow-free half
(`Storage`, the atomic writer, the disk-full notes) loads no pyarrow, so the modules the CLI's
--help imports (record, `_io`) can import them at the top."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_PROBE = """
import json, sys
import calibtune.data
from calibtune import _io
from calibtune.record import _curves, _lineage, _tracking
from calibtune.storage import Storage, disk_full_text
heavy = ("torch", "pyarrow", "numpy", "calibtune.data._common", "calibtune.storage._local")
before = sorted(m for m in heavy if m in sys.modules)
calibtune.data.list_datasets()
print(json.dumps([before, "torch" in sys.modules]))
"""


def test_the_data_face_and_the_light_storage_half_import_nothing_heavy() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=240,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    before, torch_after_use = json.loads(out.stdout.strip().splitlines()[-1])
    assert before == []
    assert torch_after_use  # the first use loads the module that holds the name


def test_every_name_of_the_data_face_resolves_to_the_module_that_defines_it() -> None:
    import importlib
    import inspect

    import calibtune.data as D

    assert set(D.__all__) <= set(dir(D))
    for name, where in D._EXPORTS.items():
        value = getattr(D, name)
        module = importlib.import_module(where, "calibtune.data")
        assert getattr(module, name) is value, name
        if inspect.isclass(value) or inspect.isfunction(value):  # its home, not a re-import
            assert value.__module__ == module.__name__, name
