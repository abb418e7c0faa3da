"""The parent-run summary is refreshed off Tune's event loop (`calibtune.study._progress`): every
ended trial reaches exactly one refresh, trials that end during a refresh are batched into the
next one, a failing refresh never leaves `drain` waiting, and `drain` returns only when all is
done."""

from __future__ import annotations

import threading
import time

from calibtune.study._progress import SummaryWorker


def _ended(i: int) -> tuple:
    return (f"t{i}", {"loss": "focal"}, {"val/ece": 0.1 * i}, False)


def test_every_ended_trial_is_refreshed_once_and_late_ones_are_batched() -> None:
    gate = threading.Event()
    batches: list[list[str]] = []

    def refresh(batch: list) -> None:
        batches.append([b[0] for b in batch])
        gate.wait(5)  # the first refresh is slow: trials end meanwhile

    worker = SummaryWorker(refresh)
    worker.submit(_ended(0))
    deadline = time.monotonic() + 5
    while not batches and time.monotonic() < deadline:
        time.sleep(0.01)
    for i in (1, 2, 3):
        worker.submit(_ended(i))
    gate.set()
    worker.drain()
    assert batches == [["t0"], ["t1", "t2", "t3"]]
    worker.submit(_ended(4))  # a new thread after the last one ended
    worker.drain()
    assert batches[-1] == ["t4"]


def test_submit_does_not_wait_for_the_refresh() -> None:
    gate = threading.Event()
    worker = SummaryWorker(lambda batch: gate.wait(5))
    t0 = time.monotonic()
    worker.submit(_ended(0))
    assert time.monotonic() - t0 < 1.0  # Tune's event loop goes on
    gate.set()
    worker.drain()


def test_a_failing_refresh_is_reported_and_drain_still_returns(capsys) -> None:
    calls: list[int] = []

    def refresh(batch: list) -> None:
        calls.append(len(batch))
        raise RuntimeError("store unavailable")

    worker = SummaryWorker(refresh)
    worker.submit(_ended(0))
    worker.drain()
    worker.submit(_ended(1))
    worker.drain()
    assert calls == [1, 1]
    out = capsys.readouterr().out
    assert out.count("parent-run summary not updated") == 2 and "store unavailable" in out


def test_the_callbacks_pickle_while_a_worker_exists(tmp_path) -> None:
    """Tune pickles a study's callbacks (tuner.pkl) — also for a later study in the same driver
    process, when an earlier study's summary worker (with its lock) exists."""
    import cloudpickle

    from calibtune.study._progress import _worker, study_callbacks
    from calibtune.study._trainable import StudyPayload
    from calibtune.studyfile._config import load_study

    _worker("an-earlier-parent-run", lambda batch: None).submit(_ended(0))
    study = load_study("studies/quickstart.yaml")
    payload = StudyPayload(study, "sqlite:///x.db", "1", "parent", str(tmp_path))
    callbacks = study_callbacks(study, payload, tmp_path)
    restored = cloudpickle.loads(cloudpickle.dumps(callbacks))
    assert [type(c).__name__ for c in restored] == [type(c).__name__ for c in callbacks]


def test_a_later_study_in_the_process_starts_clean(tmp_path) -> None:
    """`run_study` reads these after `Tuner.fit`: the guard's stop message once, and the drained
    workers are forgotten, so a resume of the same parent run in this process gets its own."""
    from calibtune.study._progress import _record_guard, _worker, drain_summaries, guard_message

    _record_guard(tmp_path, "storage full")
    assert guard_message(tmp_path) == "storage full"
    assert guard_message(tmp_path) is None
    first: list[str] = []
    second: list[str] = []
    _worker("parent", lambda batch: first.extend(b[0] for b in batch)).submit(_ended(0))
    drain_summaries()
    _worker("parent", lambda batch: second.extend(b[0] for b in batch)).submit(_ended(1))
    drain_summaries()
    assert (first, second) == (["t0"], ["t1"])
