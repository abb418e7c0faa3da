"""What `calibtune submit` sends besides the study (issue 41): the submitting shell's variables
by an allow-list — endpoints, regions, MLflow client settings, never a credential or this
machine's own files unless named with ``--env NAME`` — and one ``submission_id`` per submit, so
that a request retried after the head (or a proxy in front of it) dropped its answer cannot
start a second driver, while a later submit of the same study starts a new job.

The job API below the real ``JobSubmissionClient`` is a small HTTP server speaking Ray's job
REST protocol (``/api/version``, ``POST /api/jobs/``) with Ray's own answer to a used
``submission_id``; it keeps every request body, the job spec as it crossed the wire.
"""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from calibtune.cli import main

STUDY = {
    "name": "s",
    "trial": {
        "data": {"name": "digits"},
        "model": {"name": "mlp"},
        "train": {"epochs": 1, "batch_size": 64},
    },
    "losses": ["cross_entropy"],
    "search": {"num_samples": 1, "max_concurrent": 1, "objectives": [{"metric": "val/ece"}]},
}

PLANTED = "calibtune-planted-Zq81XvB0"  # a value no real setting has: found means leaked

#: set in the submitting shell, each to a planted value: none may reach the job unnamed
NEVER = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_CA_BUNDLE",
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_CONFIG_FILE",
    "AWS_ROLE_ARN",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "MLFLOW_TRACKING_USERNAME",
    "MLFLOW_TRACKING_PASSWORD",
    "MLFLOW_TRACKING_TOKEN",
)
#: the store's address and client settings the nodes need and the shell names
SENT = {
    "AWS_ENDPOINT_URL_S3": "http://s3.lab:9000",
    "AWS_REGION": "eu-west-1",
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "3",
    "RAY_TRAIN_ENABLE_V2": "1",
    "CALIBTUNE_DATA_MIRROR": "http://mirror.lab/",
}


@pytest.fixture
def shell(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in NEVER:
        monkeypatch.setenv(name, f"{PLANTED}-{name}")
    for name, value in SENT.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("SOME_OTHER_SETTING", "x")


def _study(tmp_path: Path) -> Path:
    """A study outside any project (nothing uploaded: the job spec is all that travels)."""
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(STUDY))
    return path


def _where(tmp_path: Path) -> dict[str, str]:
    return {"storage": f"{tmp_path}/shared", "tracking_uri": f"sqlite:///{tmp_path}/m.db"}


def test_the_job_gets_the_allow_list_and_no_secret_unless_named(tmp_path, shell) -> None:
    """Today's code sent every AWS_* and MLFLOW_* variable: the secret key, the tracking
    password, and this machine's AWS_PROFILE/AWS_CA_BUNDLE, which override the nodes' roles."""
    from calibtune.cluster._jobs import submission
    from calibtune.study import load_study

    study = load_study(_study(tmp_path))
    spec = submission(study, **_where(tmp_path))
    sent = spec["runtime_env"]["env_vars"]
    assert {k: sent.get(k) for k in SENT} == SENT
    assert not set(NEVER) & set(sent) and "SOME_OTHER_SETTING" not in sent
    assert PLANTED not in json.dumps(spec)  # nowhere in the spec, entrypoint and metadata too

    named = ["AWS_SECRET_ACCESS_KEY", "MLFLOW_TRACKING_PASSWORD"]
    spec = submission(study, **_where(tmp_path), env_names=named)
    sent = spec["runtime_env"]["env_vars"]
    assert {k: sent[k] for k in named} == {k: f"{PLANTED}-{k}" for k in named}
    assert not (set(NEVER) - set(named)) & set(sent)


def _submit(capsys, *argv: str) -> tuple[int, list[str], list[str]]:
    capsys.readouterr()
    try:
        code = int(main(["submit", *argv]))
    except SystemExit as exc:
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out.splitlines(), out.err.splitlines()


@pytest.mark.parametrize(
    ("names", "line"),
    [
        (["NOT_SET_HERE_X"], "--env NOT_SET_HERE_X: expected a variable set in this shell"),
        (["AWS_SECRET_ACCESS_KEY=abc"], "--env: expected the name of a variable set here"),
        (["CALIBTUNE_STUDY_YAML"], "--env: expected the name of .* \\(submit sets it\\)"),
    ],
)
def test_env_names_are_checked_before_the_cluster(tmp_path, capsys, shell, names, line) -> None:
    """One line, exit 2, before the dashboard (a closed port) is contacted."""
    args = [str(_study(tmp_path)), "--storage", f"{tmp_path}/shared"]
    args += ["--tracking-uri", f"sqlite:///{tmp_path}/m.db", "--address", "http://127.0.0.1:1"]
    for name in names:
        args += ["--env", name]
    code, _, err = _submit(capsys, *args)
    assert code == 2 and len(err) == 1, err
    assert re.search(line, err[0]) and PLANTED not in err[0], err


# ---------------------------------------------------------- the job API, below Ray's client


class _JobAPI(BaseHTTPRequestHandler):
    """Ray's job REST API as the client meets it: the version, and job submission keyed by
    ``submission_id`` (Ray's own words for one already used). The first ``drop`` submissions
    start their job and then answer 504, as a proxy in front of a slow head does."""

    jobs: dict[str, dict]
    bodies: list[bytes]
    drop: list[int]

    def log_message(self, *args: object) -> None:
        pass

    def _answer(self, status: int, text: str, kind: str = "text/plain") -> None:
        data = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        import ray

        if self.path.rstrip("/") == "/api/version":
            body = {"version": "4", "ray_version": ray.__version__, "ray_commit": "x"}
            self._answer(200, json.dumps(body), "application/json")
        else:
            self._answer(404, "not found")

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.bodies.append(body)
        req = json.loads(body)
        sid = req.get("submission_id") or f"raysubmit_{len(self.jobs)}"
        if sid in self.jobs:
            self._answer(
                400,
                "Traceback (most recent call last):\nValueError: Job with submission_id "
                f"{sid} already exists. Please use a different submission_id.\n",
            )
            return
        self.jobs[sid] = req
        if self.drop[0] > 0:
            self.drop[0] -= 1
            self._answer(504, "Gateway Timeout")
            return
        self._answer(200, json.dumps({"job_id": sid, "submission_id": sid}), "application/json")


@pytest.fixture
def job_api():
    handler = type("Handler", (_JobAPI,), {"jobs": {}, "bodies": [], "drop": [1]})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield handler, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_retried_submit_starts_one_job_and_a_later_submit_another(
    tmp_path, capsys, monkeypatch, shell, job_api
) -> None:
    """The first request starts the job but its answer is lost (a proxy's 504): `submit` sends
    it again with the same submission_id, the head answers that it exists, and `submit`
    reports that job: one driver. Today's code sent no submission_id (the head made one per
    request) and failed on the 504. A later `submit` of the same study is a new job."""
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # the stand-in head asks no token
    api, url = job_api
    args = [str(_study(tmp_path)), "--storage", f"{tmp_path}/shared"]
    args += ["--tracking-uri", f"sqlite:///{tmp_path}/m.db", "--address", url, "--verbose"]

    code, out, err = _submit(capsys, *args)
    assert code == 0, err
    assert len(api.jobs) == 1 and len(api.bodies) == 2, api.bodies
    (first,) = api.jobs
    assert first.startswith("calibtune-s-")
    assert [json.loads(b)["submission_id"] for b in api.bodies] == [first, first]
    assert out[0] == f"submitted study s as Ray job {first}"

    code, out, err = _submit(capsys, *args)  # a later submit of the same study
    assert code == 0, err
    assert len(api.jobs) == 2 and len(api.bodies) == 3
    (second,) = set(api.jobs) - {first}
    assert out[0] == f"submitted study s as Ray job {second}"

    # the job spec as it crossed the wire: the allow-list, no planted value
    assert not [b for b in api.bodies if PLANTED.encode() in b]
    sent = api.jobs[second]["runtime_env"]["env_vars"]
    assert sent["AWS_ENDPOINT_URL_S3"] == SENT["AWS_ENDPOINT_URL_S3"]
