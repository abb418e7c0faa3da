"""Issue 27 items 5-7 without a GPU (a monkeypatched `torch.cuda`): packed trials hold their
share of the device, the utilisation sampler never outlives a failed epoch, `gpu_util` is
declared with its dependency, and a refused ``use_gpu`` says torch's own reason."""

from __future__ import annotations

import threading
import tomllib
import warnings
from pathlib import Path

import pytest
import torch
from torch.utils.data import TensorDataset

from calibtune.losses import build_loss
from calibtune.models import build_model
from calibtune.training import LoopSpec, NonFiniteLossError, train_epochs
from calibtune.training import _loop as loop
from calibtune.training import _utilisation as util
from calibtune.trial import _placement as placement
from calibtune.trial import _worker as worker
from calibtune.trial import config_from_dict
from calibtune.trial._driver import check_resources
from calibtune.trial._placement import hold_share, worker_bundle

ROOT = Path(__file__).resolve().parents[1]
CUDA0 = torch.device("cuda", 0)


GIB = 2**30


@pytest.fixture
def fake_cuda(monkeypatch):
    """A GPU machine as seen from below the functions under test: CUDA's lazy init, the current
    device, the memory queries and the C setter of the memory fraction are answered and recorded;
    torch's own ``set_per_process_memory_fraction`` (its device and range checks) runs for real.
    """
    calls: dict[str, list] = {"fraction": [], "util": 0}

    def utilization(device=None):
        calls["util"] += 1
        return 40

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "_lazy_init", lambda: None)
    monkeypatch.setattr(torch.cuda.memory, "_lazy_init", lambda: None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(
        torch._C,
        "_cuda_setMemoryFraction",
        lambda f, d: calls["fraction"].append((f, d)),
        raising=False,
    )
    # 80 GiB device; this process: 1 GiB context outside a 0.5 GiB allocator reservation
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d=None: (60 * GIB, 80 * GIB))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda d=None: GIB // 2)
    monkeypatch.setattr(placement, "_nvml_process_used", lambda d: GIB + GIB // 2)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda d=None: None)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda d=None: 3 * 2**29)
    monkeypatch.setattr(torch.cuda, "utilization", utilization)
    return calls


@pytest.fixture
def inductor_threads(monkeypatch):
    import torch._inductor.config as inductor

    before = inductor.compile_threads  # a config module: monkeypatch's undo would delete it
    monkeypatch.delenv("TORCHINDUCTOR_COMPILE_THREADS", raising=False)
    yield inductor
    inductor.compile_threads = before


# ------------------------------------------------------------------ item 5: packed trials


def _scaling(**over):
    base = {"name": "t", "data": {"name": "digits"}, "model": {"name": "mlp"}}
    base["scaling"] = {"num_workers": 0, "use_gpu": True, **over}
    return config_from_dict(base).scaling


def test_four_packed_trials_each_cap_their_memory_and_compile_threads(fake_cuda, inductor_threads):
    bundle = worker_bundle(_scaling(resources_per_worker={"GPU": 0.25, "CPU": 3}))
    assert bundle == {"CPU": 3.0, "GPU": 0.25}
    out = hold_share(bundle, CUDA0)
    # a quarter of the device less this process's 1 GiB context: (0.25 · 80 − 1) / 80
    cap = (0.25 * 80 - 1) / 80
    assert fake_cuda["fraction"] == [(pytest.approx(cap, abs=1e-15), 0)]
    assert out == {"compile_threads": 3, "gpu_memory_fraction": pytest.approx(cap, abs=1e-15)}
    import os

    assert os.environ["TORCHINDUCTOR_COMPILE_THREADS"] == "3"
    assert inductor_threads.compile_threads == 3  # imported already: its config, not only env


def test_four_packed_caps_and_their_contexts_fit_on_the_device(fake_cuda, inductor_threads):
    """Capped at f × total (the old cap) or at f × (total − overhead), four quarter trials plus
    their four contexts exceed the device; capped at f × total − overhead they fit exactly."""
    share = 0.25
    cap = hold_share({"CPU": 1.0, "GPU": share}, CUDA0)["gpu_memory_fraction"]
    total, context = 80 * GIB, GIB
    assert 4 * (cap * total + context) == total
    assert 4 * (share * total + context) > total  # the old cap
    assert 4 * (share * (total - context) + context) > total


def test_a_local_trial_unindexed_cuda_device_gets_the_current_index(fake_cuda, inductor_threads):
    """``calibtune train --use-gpu``: a local trial's ``cuda`` (no index) reached torch's
    ``set_per_process_memory_fraction``, which refuses it (``Expected a torch.device with a
    specified index``), for a whole GPU as for a share."""
    with pytest.raises(ValueError, match="specified index"):
        torch.cuda.set_per_process_memory_fraction(1.0, torch.device("cuda"))  # torch's rule
    for share in (1.0, 0.5):
        fake_cuda["fraction"].clear()
        hold_share({"CPU": 1.0, "GPU": share}, torch.device("cuda"))
        assert [d for _, d in fake_cuda["fraction"]] == [0]
    assert placement.indexed_device("cuda") == CUDA0


def test_without_nvml_the_overhead_is_read_from_the_device_and_bounded(
    fake_cuda, monkeypatch, inductor_threads
):
    monkeypatch.setattr(placement, "_nvml_process_used", lambda d: None)
    overhead, total, how = placement.process_overhead(CUDA0)  # 80 − 60 − 0.5 GiB, at most 2 GiB
    assert (overhead, total, how) == (placement.MAX_CONTEXT_OVERHEAD, 80 * GIB, "mem_get_info")
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d=None: (79 * GIB, 80 * GIB))
    assert placement.process_overhead(CUDA0)[0] == GIB // 2


def test_a_whole_gpu_resets_the_cap_and_the_cpu_sets_no_cap(fake_cuda, inductor_threads):
    hold_share(worker_bundle(_scaling()), CUDA0)  # {"CPU": 1, "GPU": 1}: a reused worker
    assert fake_cuda["fraction"] == [(1.0, 0)]
    assert hold_share({"CPU": 0.5}, torch.device("cpu")) == {
        "compile_threads": 1,
        "gpu_memory_fraction": None,
    }
    assert fake_cuda["fraction"] == [(1.0, 0)]


def test_the_local_trial_builds_on_an_indexed_device(fake_cuda, monkeypatch, tmp_path):
    """The call site: `_build` of a local GPU trial passes ``cuda:<current>`` on, so the memory
    cap, the RNG capture and NVML all get an index."""
    seen = []
    monkeypatch.setattr(worker, "hold_share", lambda bundle, device: seen.append(device))

    class Stop(Exception):
        pass

    def stop(*a, **k):
        raise Stop

    monkeypatch.setattr(worker, "Precision", stop)
    cfg = config_from_dict(
        {"name": "t", "data": {"name": "digits"}, "model": {"name": "mlp"},
         "scaling": {"num_workers": 0, "use_gpu": True}}
    )  # fmt: skip
    with pytest.raises(Stop):
        worker._build(cfg, {"tune_report": True}, None)
    assert seen == [CUDA0]


def test_the_trial_worker_holds_its_share_before_building_anything():
    """The call site: `_build` holds the share from the trial's own bundle, before the loss (the
    one thing that compiles) is built."""
    src = (ROOT / "calibtune" / "trial" / "_worker.py").read_text()
    build = src[src.index("def _build(") :]
    assert "hold_share(worker_bundle(cfg.scaling), device)" in build
    assert build.index("hold_share(") < build.index("compile_loss(")


# ------------------------------------------------------------------ item 5/6: what is reported


def test_gpu_keys_report_this_process_memory_beside_device_wide_utilisation(fake_cuda):
    with util.DeviceMonitor(CUDA0, period_s=0.01) as m:
        deadline = threading.Event()
        while fake_cuda["util"] < 2 and not deadline.wait(0.01):
            pass
        out = m.stop()
    assert out == {"gpu_mem_gib": 1.5, "gpu_util": 40.0}


def test_without_nvml_gpu_util_is_missing_and_one_warning_says_why(fake_cuda, monkeypatch):
    def no_nvml(device=None):
        raise ModuleNotFoundError("pynvml does not seem to be installed")

    monkeypatch.setattr(torch.cuda, "utilization", no_nvml)
    monkeypatch.setattr(util, "_warned", set())
    with pytest.warns(RuntimeWarning, match=r"^gpu_util: not reported, NVML failed \(Module"):
        m = util.DeviceMonitor(CUDA0, period_s=0.01).start()
        m._thread.join(5)
        assert m.stop() == {"gpu_mem_gib": 1.5}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per process
        m = util.DeviceMonitor(CUDA0, period_s=0.01).start()
        m._thread.join(5)
        m.stop()


def test_nvidia_ml_py_is_the_gpu_extra_and_pinned():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    gpu = meta["project"]["optional-dependencies"]["gpu"]
    assert any(d.replace(" ", "").startswith("nvidia-ml-py") for d in gpu)
    pins = (ROOT / "constraints.txt").read_text().splitlines()
    assert any(p.startswith("nvidia-ml-py==") for p in pins)


# ------------------------------------------------------------------ item 7: no leaked thread


def _digits(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(
        torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, 10, (n,), generator=g)
    )


def _samplers() -> int:
    return sum(t.name == "calibtune-gpu" and t.is_alive() for t in threading.enumerate())


def test_a_failing_epoch_stops_the_utilisation_thread(fake_cuda, monkeypatch):
    """In-process retries (local mode's ``max_failures``) must not leak one sampler per try."""

    class OnCuda(util.DeviceMonitor):  # the epoch runs on the CPU, its monitor samples "CUDA"
        def __init__(self, device, period_s=0.25):
            super().__init__(CUDA0, period_s)

    monkeypatch.setattr(loop, "DeviceMonitor", OnCuda)
    model = build_model("mlp", 10, (1, 8, 8))
    spec = LoopSpec(
        model=model,
        loss_fn=build_loss("cross_entropy"),
        optimizer=torch.optim.SGD(model.parameters(), lr=1e30),  # diverges at once
        lr_at=lambda e: 1e30,
        train_set=_digits(64, 1),
        val_set=_digits(32, 2),
        test_set=None,
        epochs=1,
        batch_size=16,
    )
    before = _samplers()
    for _ in range(3):
        with pytest.raises(NonFiniteLossError):
            train_epochs(spec)
    assert _samplers() == before


# ------------------------------------------------------------------ item 7: torch's reason


def test_a_refused_use_gpu_says_torchs_reason_and_the_versions(monkeypatch):
    """A driver too old for this torch: torch warns from ``is_available()`` and raises from
    ``init()``; the refusal quotes both, with the driver and CUDA versions, on one line."""

    def is_available():
        msg = "CUDA initialization: The NVIDIA driver on your system is too old (found version"
        warnings.warn(f"{msg} 11040).\n Please update your GPU driver", UserWarning, stacklevel=1)
        return False

    def init():
        raise RuntimeError("The NVIDIA driver on your system is too old (found version 11040).")

    monkeypatch.setattr(torch.cuda, "is_available", is_available)
    monkeypatch.setattr(torch.cuda, "init", init)
    monkeypatch.setattr(util, "_driver_version", lambda: "470.57.02")
    cfg = config_from_dict(
        {"name": "t", "data": {"name": "digits"}, "model": {"name": "mlp"},
         "scaling": {"num_workers": 0, "use_gpu": True}}
    )  # fmt: skip
    with pytest.raises(ValueError) as info:
        check_resources(cfg, {"CPU": 2.0, "GPU": 0.0}, "this machine (a local Ray)")
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith("scaling.use_gpu: expected a visible GPU on this machine (a local Ray)")
    assert "too old (found version 11040)" in msg and "Please update your GPU driver" in msg
    assert "NVIDIA driver 470.57.02" in msg
    assert f"torch built for CUDA {torch.version.cuda or 'none'}" in msg


def test_a_remote_cluster_without_gpus_is_not_explained_by_this_process():
    cfg = config_from_dict(
        {"name": "t", "data": {"name": "digits"}, "model": {"name": "mlp"},
         "scaling": {"num_workers": 1, "use_gpu": True}}
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"found none; set scaling\.use_gpu: false"):
        check_resources(cfg, {"CPU": 2.0}, "the Ray cluster")
