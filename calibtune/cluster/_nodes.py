"""What every node of a cluster runs: the versions a study's trials depend on, probed before the
first trial.

A cluster whose nodes install software per job (a ``runtime_env`` with ``pip``/``uv``, an
``image_uri``) or per image can run another calibtune, torch, Ray, MLflow or Optuna on some node
than on the driver: trials there would train with another loss implementation, log to MLflow with
another client or fail on a pickled object. `check_node_versions` runs one task on every other
alive node (pinned to it, no CPU asked, so a busy node answers too) and refuses a mismatch in one
line naming the node and both versions. The driver's own node runs the driver's environment and is
not probed (a local Ray has no other node: nothing is started).

A cluster that scales its GPU workers from zero has only its head at the start: a node that
joins later is checked by `check_this_node`, in the first trial process that runs there (cached
per process and, by a marker in the study folder, per node): its versions (read without torch)
and whether it sees the study's storage through the trials' own client. A node that fails is
named in one line and its trials are refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import metadata
from typing import Any

from calibtune.storage import open_storage

__all__ = [
    "NODE_MARKS",
    "PACKAGES",
    "NodeRefusedError",
    "check_node_versions",
    "check_this_node",
    "node_versions",
    "version_mismatch",
]

#: the distributions whose versions must agree on every node
PACKAGES = ("calibtune", "torch", "ray", "mlflow", "optuna")

_PROBE_TIMEOUT_S = 300.0


def node_versions() -> dict[str, str]:
    """This process's versions of `PACKAGES` (``absent`` where not installed), read from the
    installed distributions' metadata (what pip or uv installed on this node).

    >>> node_versions()["ray"] != "absent"
    True
    """
    out = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "absent"
    return out


#: the probe a node runs, defined outside any importable module so that Ray sends it by value:
#: a node whose Python cannot import calibtune (a venv not activated before ``ray start``) still
#: answers with what it lacks, instead of failing on the unpickling of a calibtune function
_PROBE_SOURCE = """
def probe(packages):
    import importlib, sys
    from importlib import metadata
    versions, missing = {}, []
    for name in packages:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "absent"
    for name in packages:
        try:
            importlib.import_module(name)
        except Exception as exc:
            missing.append(f"{type(exc).__name__}: {exc}")
    try:
        import torch
        cuda = bool(torch.cuda.is_available())
    except Exception:
        cuda = None
    return {"versions": versions, "cuda": cuda, "python": sys.executable, "missing": missing}
"""


def _probe_function() -> Any:
    """`_PROBE_SOURCE`'s ``probe`` (module ``calibtune_node_probe``, which no node imports)."""
    namespace: dict[str, Any] = {"__name__": "calibtune_node_probe"}
    exec(compile(_PROBE_SOURCE, "<calibtune node probe>", "exec"), namespace)
    return namespace["probe"]


def _report() -> dict[str, Any]:
    """What a node's probe returns: its versions, whether torch sees CUDA there, its Python and
    the imports of `PACKAGES` that fail there."""
    return _probe_function()(PACKAGES)


def version_mismatch(
    driver: Mapping[str, str], nodes: Mapping[str, Mapping[str, Any]]
) -> str | None:
    """The first node (by name) whose versions differ from the driver's, as one line; None
    when all agree. ``nodes``: name → `_report` of that node.

    >>> same = {"ray": "2.60.0", "torch": "2.8.0"}
    >>> version_mismatch(same, {"n1 (10.0.0.2)": {"versions": same, "cuda": True}}) is None
    True
    >>> other = {"versions": {"ray": "2.60.0", "torch": "2.4.1"}, "cuda": False}
    >>> version_mismatch(same, {"n1 (10.0.0.2)": other}).split(";")[0]
    "node n1 (10.0.0.2): expected the driver's torch 2.8.0, found torch 2.4.1 (CUDA not seen there)"
    """
    for name in sorted(nodes):
        have = nodes[name]["versions"]
        diff = [p for p in driver if have.get(p) != driver[p]]
        if diff:
            want = ", ".join(f"{p} {driver[p]}" for p in diff)
            found = ", ".join(f"{p} {have.get(p, 'absent')}" for p in diff)
            cuda = {True: " (CUDA seen there)", False: " (CUDA not seen there)"}.get(
                nodes[name].get("cuda"), ""
            )
            python = nodes[name].get("python")
            if python and any(have.get(p) == "absent" for p in diff):
                return (
                    f"node {name}: expected the driver's {want}, found {found} for {python} "
                    f"there{cuda}; start that node's Ray from the environment that has them "
                    "(activate the venv before `ray start`), or give the job one "
                    "(--runtime-env with pip and constraints.txt, or one image)"
                )
            return (
                f"node {name}: expected the driver's {want}, found {found}{cuda}; "
                "install one set of versions on every node (--runtime-env with pip and "
                "constraints.txt, or one image)"
            )
    for name in sorted(nodes):
        if missing := nodes[name].get("missing"):
            return (
                f"node {name}: expected {nodes[name].get('python', 'its Python')} to import "
                f"calibtune's packages, got {missing[0]}; start that node's Ray from the "
                "environment that has them (activate the venv before `ray start`), or give the "
                "job one (--runtime-env, one image)"
            )
    return None


def check_node_versions() -> None:
    """Probe every alive node but the driver's (one task pinned to each) and raise a one-line
    ValueError on a version mismatch or a node that does not answer in time."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = ray.get_runtime_context().get_node_id()
    others = [n for n in ray.nodes() if n["Alive"] and n["NodeID"] != here]
    if not others:
        return
    probe = ray.remote(num_cpus=0, max_retries=0)(_probe_function())
    refs = {
        f"{n['NodeID'][:12]} ({n['NodeManagerAddress']})": probe.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
        ).remote(PACKAGES)
        for n in others
    }
    ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=_PROBE_TIMEOUT_S)
    reports = {}
    for name, ref in refs.items():
        if ref not in ready:
            raise ValueError(
                f"node {name}: expected an answer to the version probe within "
                f"{_PROBE_TIMEOUT_S:.0f} s, got none (is its runtime_env still installing?)"
            )
        try:
            reports[name] = ray.get(ref)
        except Exception as exc:  # the task could not run there: say so in one line
            why = " ".join(f"{type(exc).__name__}: {exc}".split())[:200]
            raise ValueError(
                f"node {name}: expected the version probe to run, got {why}; check that "
                "node's Python environment (activate the venv before `ray start`)"
            ) from None
    if (line := version_mismatch(node_versions(), reports)) is not None:
        raise ValueError(line)


#: the study folder's record of the nodes whose first trial checked them (one object a node)
NODE_MARKS = ".calibtune-nodes"
_CHECKED: set[str] = set()  # nodes this process has checked


class NodeRefusedError(ValueError):
    """A node that joined the cluster after the study started cannot run its trials (one line
    naming the node): other versions, or storage it does not see."""


def check_this_node(study_dir: str, state_file: str, driver: Mapping[str, str], node: str) -> None:
    """In a trial process on Ray node ``node``: refuse (`NodeRefusedError`) this node's trials
    when it runs other versions of `PACKAGES` than the ``driver``'s, or does not see the study
    folder ``study_dir`` (the string trials are given, opened with this node's environment)
    holding ``state_file``; else record the node as checked (`NODE_MARKS`)."""
    if node in _CHECKED:
        return
    name = f"{node[:12]} ({_address()})"
    line = version_mismatch(driver, {name: {"versions": node_versions()}})
    if line is not None:
        raise NodeRefusedError(f"{line}; its trials are refused")
    try:
        folder = open_storage(study_dir)
        marker = folder / NODE_MARKS / node
        if not marker.is_file():
            if not (folder / state_file).is_file():
                raise FileNotFoundError(2, f"no {state_file} there", folder.uri)
            marker.write_text(node)
    except (OSError, ValueError) as exc:
        why = " ".join(str(exc).split())[:200]
        raise NodeRefusedError(
            f"node {name}: expected the study's storage {study_dir} as the driver sees it, got "
            f"{why}; give the node the driver's storage (mount, endpoint, credentials); its "
            "trials are refused"
        ) from None
    _CHECKED.add(node)


def _address() -> str:
    import ray

    return str(ray.util.get_node_ip_address())
