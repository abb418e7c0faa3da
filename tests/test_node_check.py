"""A node that joins a cluster after the study started (GPU workers scaled from zero) is checked
by its first trial: its versions and whether it sees the study's storage through the trials' own
client; a failing node is named in one line and its trials refused."""

from __future__ import annotations

import pytest

from calibtune.cluster import _nodes as N
from calibtune.studyfile._studydir import STATE_FILE


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.setattr(N, "_CHECKED", set())
    monkeypatch.setattr(N, "_address", lambda: "10.0.0.7")


def test_a_node_that_sees_the_study_is_recorded_once(tmp_path):
    (tmp_path / STATE_FILE).write_text("{}")
    N.check_this_node(str(tmp_path), STATE_FILE, N.node_versions(), "a" * 40)
    assert (tmp_path / N.NODE_MARKS / ("a" * 40)).read_text() == "a" * 40
    (tmp_path / STATE_FILE).unlink()  # checked: neither this process nor the node asks again
    N.check_this_node(str(tmp_path), STATE_FILE, N.node_versions(), "a" * 40)
    N._CHECKED.clear()
    N.check_this_node(str(tmp_path), STATE_FILE, N.node_versions(), "a" * 40)


def test_a_node_without_the_study_folder_is_refused_in_one_line(tmp_path):
    """A node whose mount or endpoint differs: the path is empty there (no study state)."""
    with pytest.raises(N.NodeRefusedError) as info:
        N.check_this_node(str(tmp_path / "elsewhere"), STATE_FILE, N.node_versions(), "b" * 40)
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith(f"node {'b' * 12} (10.0.0.7): expected the study's storage ")
    assert f"no {STATE_FILE} there" in msg and msg.endswith("its trials are refused")
    assert not (tmp_path / "elsewhere").exists()  # nothing written where the driver is not


def test_a_node_with_other_versions_is_refused_naming_both(tmp_path):
    (tmp_path / STATE_FILE).write_text("{}")
    driver = {**N.node_versions(), "torch": "0.0.1"}
    with pytest.raises(N.NodeRefusedError) as info:
        N.check_this_node(str(tmp_path), STATE_FILE, driver, "c" * 40)
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith(f"node {'c' * 12} (10.0.0.7): expected the driver's torch 0.0.1, found")
    assert not (tmp_path / N.NODE_MARKS).exists()


def test_the_probe_task_opens_the_string_trials_get(tmp_path, monkeypatch):
    """The driver's pickled client (endpoint, keys of the driver's shell) never reaches the
    probe: it opens the location from the same string as a trial does, on the node."""
    import types

    import ray

    from calibtune.storage import _probe

    context = types.SimpleNamespace(get_node_id=lambda: "n" * 40)
    monkeypatch.setattr(ray, "get_runtime_context", lambda: context)
    (tmp_path / "tok.driver").write_text("tok")
    assert _probe._probe_node(str(tmp_path), "tok") is None
    assert (tmp_path / f"tok.{'n' * 40}").read_text() == "tok"
    why = _probe._probe_node("s3:/not-a-uri", "tok")
    assert why.startswith("could not open s3:/not-a-uri: ")


def test_a_node_whose_python_lacks_a_package_is_told_which_interpreter_and_how_to_fix():
    """The probe runs on the node by value (a node whose Python cannot import calibtune still
    answers) and reports its interpreter and the imports that fail there."""
    import cloudpickle

    probe = N._probe_function()
    assert b"calibtune.study" not in cloudpickle.dumps(probe)  # sent by value, not by module
    here = probe(("ray", "calibtune_no_such_package"))
    assert here["versions"]["calibtune_no_such_package"] == "absent" and here["python"]
    assert here["missing"] == ["ModuleNotFoundError: No module named 'calibtune_no_such_package'"]
    driver = {"ray": here["versions"]["ray"], "optuna": "5.0.0"}
    node = {**here, "versions": {"ray": here["versions"]["ray"], "optuna": "absent"}}
    line = N.version_mismatch(driver, {"n1 (10.0.0.2)": node})
    assert "\n" not in line
    assert line.startswith(
        f"node n1 (10.0.0.2): expected the driver's optuna 5.0.0, found optuna absent for "
        f"{here['python']} there"
    )
    assert "activate the venv before `ray start`" in line
