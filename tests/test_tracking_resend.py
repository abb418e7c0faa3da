"""An MLflow server that dies mid-answer (issue 29's fault test met it once: the kill landed
while the server was sending a `log-batch` answer). urllib3 retries requests that got no
answer; an answer cut off part-way is MLflow's ``API request … failed with exception
('Connection broken: IncompleteRead …')``, which failed the trial. calibtune's client sends
such a call again when it is one that may be sent twice (`RESENDABLE`).

The server here is a real HTTP server on 127.0.0.1 speaking MLflow's REST endpoint, standing in
for one that is killed mid-answer: it cuts off its first answers after the headers."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from calibtune.record import _mlflow_store as store
from calibtune.record import _tracking as T


class _Server(ThreadingHTTPServer):
    cut: int  # answers still to cut off
    seen: list[tuple[str, bytes]]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        server: _Server = self.server  # type: ignore[assignment]
        server.seen.append((self.path, body))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "2")
        self.end_headers()
        if server.cut > 0:  # the process dies here: headers sent, the body never
            server.cut -= 1
            self.wfile.flush()
            self.close_connection = True
            return
        self.wfile.write(b"{}")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[_Server]:
    srv = _Server(("127.0.0.1", 0), _Handler)
    srv.cut, srv.seen = 1, []
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _uri(srv: _Server) -> str:
    return f"http://127.0.0.1:{srv.server_address[1]}"


def test_metrics_whose_answer_was_cut_off_are_sent_again_and_noted(server, tmp_path, monkeypatch):
    monkeypatch.setattr(store, "_WATCHED", {str(tmp_path / T.RETRIES_FILE)})
    T.log_metrics(_uri(server), "r" * 32, {"val/ece": 0.25, "train/loss": 1.5}, step=3)
    assert [p for p, _ in server.seen] == ["/api/2.0/mlflow/runs/log-batch"] * 2
    first, again = (json.loads(b) for _, b in server.seen)
    assert first == again  # the same metrics, timestamps included: MLflow keeps one copy
    assert {m["key"] for m in first["metrics"]} == {"val/ece", "train/loss"}
    note = T.retries_note(tmp_path, _uri(server), failed=0)
    assert note is not None and "(1 requests retried" in note and "nothing was lost" in note


def test_a_server_that_keeps_cutting_off_fails_after_three_more_tries(server, monkeypatch):
    server.cut = 10
    monkeypatch.setattr(store.time, "sleep", lambda s: None)
    with pytest.raises(Exception, match="Connection broken"):
        T.set_tag(_uri(server), "r" * 32, "k", "v")
    assert len(server.seen) == 4


def test_a_call_that_may_not_be_sent_twice_is_not(server):
    client = T._client(_uri(server))
    with pytest.raises(Exception, match="Connection broken"):
        client.create_run("0")  # a second one would be a second run
    assert len(server.seen) == 1


def test_other_errors_are_not_resent():
    calls = []

    class Client:
        def set_tag(self, *args: object) -> None:
            calls.append(args)
            raise ValueError("RESOURCE_DOES_NOT_EXIST: run r not found")

    with pytest.raises(ValueError, match="not found"):
        T._Resending(Client()).set_tag("r", "k", "v")
    assert len(calls) == 1
