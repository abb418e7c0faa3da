"""20 Newsgroups with the global-pooling CNN on GloVe 6B (issue 44, items 2, 5 and 6): the MMCE
pipeline's reading, tokenising and vocabulary rules, `load_glove`'s rows, ``calibtune data
fetch`` of both sets from archives in their official layout served on 127.0.0.1, batches cut
per batch whose logits equal the authors' full-length ones, 2 epochs end to end (no Ray) and
the one-line refusals of image-only options."""

from __future__ import annotations

import hashlib
import io
import re
import tarfile
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch

from calibtune.data import FETCH_SETS, Download, FetchSet, load_glove, load_splits, verify_set
from calibtune.data._text import build_vocabulary, encode_documents, read_newsgroups, tokenize
from calibtune.data._verify import STATE_DIR
from calibtune.models import build_model
from tests.test_data_fetch import _cli, _md5, _Server, server  # noqa: F401  (fixture)

GROUPS = ("alt.atheism", "comp.graphics", "rec.autos", "sci.space")
#: words typical of each group: a document of group g draws from WORDS[g] and the shared ones
WORDS = {
    0: ["god", "belief", "atheist", "faith"],
    1: ["image", "pixel", "render", "jpeg"],
    2: ["car", "engine", "brake", "wheel"],
    3: ["orbit", "nasa", "shuttle", "launch"],
}
SHARED = ["the", "a", "of", "and", "zyzzyva"]  # zyzzyva: not in the tiny GloVe


def write_newsgroups(root: Path, per_group: int = 6) -> Path:
    """``<root>/20_newsgroups/<group>/<number>`` as in 20news-19997 (headers, a blank line,
    latin-1 bytes), plus a non-numbered file that the MMCE reader skips."""
    folder = root / "20_newsgroups"
    for g, group in enumerate(GROUPS):
        (folder / group).mkdir(parents=True)
        for k in range(per_group):
            words = [WORDS[g][(k + j) % 4] for j in range(3 + k)] + SHARED[: 2 + k % 4]
            body = ", ".join(words).upper() + "!\ncaf\xe9 " + " ".join(words)
            header = f"Newsgroups: {group}\nSubject: post {k}\n"
            (folder / group / str(50000 + 7 * k)).write_bytes(
                (header + "\n" + body + "\n").encode("latin-1")
            )
        (folder / group / "README").write_text("not a post: skipped\n")
    return folder


def write_glove(root: Path, dims: tuple[int, ...] = (50, 100)) -> Path:
    """``<root>/glove.6B/glove.6B.<d>d.txt``: a vector for every group word, two shared ones
    and a word no document has; word ``i`` is ``(i + 1)/100`` in every component."""
    folder = root / "glove.6B"
    folder.mkdir(parents=True)
    words = [w for g in WORDS.values() for w in g] + ["the", "of", "unused", "café"]
    for d in dims:
        lines = [f"{w} " + " ".join([f"{(i + 1) / 100:.2f}"] * d) for i, w in enumerate(words)]
        (folder / f"glove.6B.{d}d.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("text")
    write_newsgroups(base)
    write_glove(base)
    return base


# --- the MMCE pipeline ----------------------------------------------------------------------


def test_tokens_are_keras_text_to_word_sequence() -> None:
    assert tokenize("Re: Hello,World!\tIt's 4.5%\r\n\nA--b") == [
        "re",
        "hello",
        "world",
        "it's",
        "4",
        "5",
        "\r",
        "a",
        "b",
    ]
    assert tokenize("") == [] and tokenize(" ,. ") == []


def test_vocabulary_ranks_by_count_then_first_appearance_and_drops_the_rest() -> None:
    docs = [["c", "b", "b"], ["a", "c", "d", "a"], ["e"]]
    # counts: c 2, b 2, a 2, d 1, e 1 — ties keep first appearance (Keras' stable sort)
    assert build_vocabulary(docs, max_words=20) == ["c", "b", "a", "d", "e"]
    assert build_vocabulary(docs, max_words=3) == ["c", "b"]  # ids 1..max_words-1
    tokens, lengths = encode_documents(docs, ["c", "b"], max_length=2)
    # words outside the vocabulary are dropped (no unknown id); the last tokens are kept
    assert tokens.tolist() == [[2, 2], [0, 1], [0, 0]] and lengths.tolist() == [2, 1, 0]


def test_reader_follows_the_mmce_order_header_cut_and_encoding(root: Path) -> None:
    texts, labels, groups = read_newsgroups(root)
    assert groups == list(GROUPS) and len(texts) == 4 * 6
    assert labels.tolist() == [g for g in range(4) for _ in range(6)]
    # sorted (string) file order within a group: 50000, 50007, ..., 50035
    assert texts[0].startswith("\n\nGOD, BELIEF, ATHEIST") and "Subject" not in texts[0]
    assert "caf\xe9" in texts[0]  # latin-1 bytes read as latin-1


def test_splits_sizes_vocabulary_and_vectors(root: Path) -> None:
    s = load_splits("20newsgroups", root=root, seed=1, val_fraction=0.25)
    # test int(0.2·24) = 4, stratified (one per group); validation round(0.25·20) = 5
    assert (len(s.train), len(s.val), len(s.test)) == (15, 5, 4)
    assert sorted(s.test.labels.tolist()) == [0, 1, 2, 3]
    assert s.num_classes == 4 and s.input_shape == (100, 1000)
    v = s.train.vectors
    assert v is s.val.vectors is s.test.vectors and v.dtype == torch.float32
    texts, _, _ = read_newsgroups(root)
    vocab = build_vocabulary(tokenize(t) for t in texts)
    assert v.shape == (len(vocab) + 1, 100) and not v[0].any()  # row 0: padding
    glove_rank = {w: i for i, w in enumerate([w for g in WORDS.values() for w in g])}
    for i, w in enumerate(vocab, start=1):
        want = (glove_rank[w] + 1) / 100 if w in glove_rank else 0.0
        want = {"the": 0.17, "of": 0.18, "café": 0.20}.get(w, want)
        assert torch.all(v[i] == torch.tensor(want)), w  # words GloVe lacks: zeros
    # other split seeds move the validation set only
    other = load_splits("20newsgroups", root=root, seed=2, val_fraction=0.25)
    assert torch.equal(other.test.tokens, s.test.tokens)
    assert not torch.equal(other.val.tokens, s.val.tokens)


def test_load_glove_rows_padding_unknown_and_errors(tmp_path: Path) -> None:
    write_glove(tmp_path)
    index, vectors = load_glove(tmp_path, 50)
    assert len(index) == 20 and vectors.shape == (22, 50)
    assert index["god"] == 2 and not vectors[:2].any()  # PAD 0, UNK 1: zeros
    assert torch.all(vectors[index["orbit"]] == 0.13)
    index, vectors = load_glove(tmp_path, 100, vocab=["nasa", "missing", "god", "nasa"])
    assert index == {"nasa": 2, "god": 3} and vectors.shape == (4, 100)
    assert torch.all(vectors[2] == 0.14) and torch.all(vectors[3] == 0.01)
    with pytest.raises(ValueError, match=r"dim: expected one of \(50, 100, 200, 300\), got 64"):
        load_glove(tmp_path, 64)
    with pytest.raises(ValueError, match=r"calibtune data fetch glove6b --root .*glove.6B.zip"):
        load_glove(tmp_path, 300)
    bad = tmp_path / "glove.6B" / "glove.6B.50d.txt"
    bad.write_text(bad.read_text() + "short 1 2\n")
    with pytest.raises(ValueError, match=r"glove.6B.50d.txt:21: expected '<word>' and 50"):
        load_glove(tmp_path, 50)


# --- fetch from a local server, in the official layout ------------------------------------


def _archives(work: Path) -> dict[str, bytes]:
    src = work / "src"
    write_newsgroups(src)
    write_glove(src)
    tgz = io.BytesIO()
    with tarfile.open(fileobj=tgz, mode="w:gz") as t:
        t.add(src / "20_newsgroups", arcname="20_newsgroups")
    flat = io.BytesIO()  # glove.6B.zip: its .txt files at the top, no folder
    with zipfile.ZipFile(flat, "w") as z:
        for p in sorted((src / "glove.6B").iterdir()):
            z.write(p, p.name)
    return {"20news-19997.tar.gz": tgz.getvalue(), "glove.6B.zip": flat.getvalue()}


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch, server: _Server, tmp_path: Path) -> _Server:  # noqa: F811
    """The two official rows pointed at ``server``, with the served archives' digests (the
    newsgroups archive by SHA-256, GloVe's by MD5, as their sources publish them)."""
    for name, blob in _archives(tmp_path).items():
        server.files[f"/official/{name}"] = blob
    for key in ("20newsgroups", "glove6b"):
        real = FETCH_SETS[key]
        d = real.downloads[0]
        blob = server.files[f"/official/{d.file}"]
        md5, sha = ("", hashlib.sha256(blob).hexdigest()) if d.sha256 else (_md5(blob), "")
        row = Download(d.file, f"{server.url}/official/{d.file}", md5, True, sha256=sha)
        fields = (real.folder, {}, "", "the test")
        monkeypatch.setitem(
            FETCH_SETS, key, FetchSet(key, real.title, (row,), *fields, flat=real.flat)
        )
    monkeypatch.delenv("CALIBTUNE_DATA_MIRROR", raising=False)
    return server


def test_official_rows_name_their_source_and_pin_a_digest() -> None:
    news, glove = FETCH_SETS["20newsgroups"], FETCH_SETS["glove6b"]
    assert news.downloads[0].url == "http://qwone.com/~jason/20Newsgroups/20news-19997.tar.gz"
    assert re.fullmatch(r"[0-9a-f]{64}", news.downloads[0].sha256)
    assert glove.downloads[0].url.endswith("nlp.stanford.edu/data/glove.6B.zip")
    assert glove.downloads[0].md5 == "056ea991adb4740ac6bf1b6d9b50408b" and glove.flat
    assert "Hugging Face" in news.checksum_source and "none published" in glove.checksum_source


def test_fetch_verify_train_and_refuse(
    served: _Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data"
    rc, out, err = _cli(capsys, "fetch", "20newsgroups", "glove6b", "--root", str(data))
    assert (rc, err) == (0, []) and out.count(": fetched: ") == 2
    assert sorted(p.name for p in (data / "glove.6B").iterdir()) == [
        "glove.6B.100d.txt",
        "glove.6B.50d.txt",
    ]
    assert len(list((data / "20_newsgroups").rglob("5*"))) == 24
    rc, out, _ = _cli(capsys, "verify", "20newsgroups", "glove6b", "--root", str(data))
    assert rc == 0 and [line.split(": ")[1] for line in out.splitlines()] == ["ok", "ok"]
    s = load_splits("20newsgroups", root=data, val_fraction=0.25)
    assert len(s.train) + len(s.val) + len(s.test) == 24
    # a changed file is refused before training, naming the fetch command
    post = next((data / "20_newsgroups" / GROUPS[0]).glob("5*"))
    post.write_bytes(post.read_bytes() + b"edited")
    with pytest.raises(ValueError, match=r"changed since it was fetched.*calibtune data fetch"):
        load_splits("20newsgroups", root=data, val_fraction=0.25)
    # a mirror serving another archive is refused by the SHA-256 (one line, exit 2)
    served.files["/lab/20news-19997.tar.gz"] = b"not the archive"
    mirror = ["--mirror", f"{served.url}/lab"]
    rc, _, err = _cli(capsys, "fetch", "20newsgroups", "--root", str(tmp_path / "b"), *mirror)
    assert rc == 2 and len(err) == 1 and re.search(r"expected sha256 [0-9a-f]{64}, got", err[0])
    assert verify_set("20newsgroups", tmp_path / "b").status == "missing"
    assert not list((tmp_path / "b" / STATE_DIR / "downloads").iterdir())


# --- batches, network, training -------------------------------------------------------------


def test_batches_are_cut_and_logits_match_the_full_length_input(root: Path) -> None:
    from calibtune.training import DeviceBatches, infer_logits

    s = load_splits("20newsgroups", root=root, val_fraction=0.25)
    torch.manual_seed(0)
    model = build_model("global_pool_cnn", s.num_classes, s.input_shape).eval()
    source = DeviceBatches(s.train, torch.device("cpu"))
    idx = [torch.tensor([3, 0]), torch.tensor([7])]
    widths = [x.shape[-1] for x, _ in source.batches(idx)]
    assert widths == [int(s.train.lengths[i].max()) for i in idx] and max(widths) < 100
    # the authors' input: every document at its full 1,000 columns, zeros in front
    with torch.no_grad():
        full = torch.stack([model(s.train[i][0][None])[0] for i in range(len(s.train))])
    for batch_size in (1, 4, 64):
        logits, labels = infer_logits(
            model, s.train, batch_size=batch_size, device=torch.device("cpu")
        )
        torch.testing.assert_close(logits, full, rtol=1e-5, atol=1e-6)
        assert torch.equal(labels, s.train.labels)


def _config(root: Path, **over: Any) -> Any:
    from calibtune.trial import config_from_dict

    raw: dict[str, Any] = {
        "name": "ng",
        "seed": 3,
        "data": {"name": "20newsgroups", "root": str(root), "val_fraction": 0.25},
        "model": {"name": "global_pool_cnn"},
        "loss": {"name": "focal", "params": {"gamma": 3.0}},
        "optimizer": {"name": "adam", "lr": 0.001, "weight_decay": 0.0},
        "schedule": {"name": "constant"},
        "train": {"epochs": 2, "batch_size": 8},
        "eval": {"posthoc": ["ts"]},
    }
    raw.update(over)
    return config_from_dict(raw)


def test_two_epochs_end_to_end_report_every_metric(root: Path) -> None:
    from calibtune.losses import build_loss
    from calibtune.metrics import REPORT_KEYS, calibration_report
    from calibtune.training import LoopSpec, evaluate_final, train_epochs

    cfg = _config(root)
    assert cfg.data.ood is None and cfg.data.shift is None  # the defaults: none for text
    torch.manual_seed(cfg.seed)
    s = load_splits("20newsgroups", root=root, val_fraction=cfg.data.val_fraction)
    model = build_model("global_pool_cnn", s.num_classes, s.input_shape)
    before = [p.detach().clone() for p in model.parameters()]
    spec = LoopSpec(
        model=model,
        loss_fn=build_loss("focal", gamma=3.0),
        optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
        lr_at=lambda e: 1e-3,
        train_set=s.train,
        val_set=s.val,
        test_set=s.test,
        epochs=2,
        batch_size=8,
        augment=None,
        seed=cfg.seed,
    )
    history: list[dict[str, Any]] = []
    cache = train_epochs(spec, on_epoch_end=lambda e, m, c: history.append(m))
    assert [h["epoch"] for h in history] == [1, 2]
    assert all(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    ref = calibration_report(logits=cache.test_logits, labels=cache.test_labels)
    for k in REPORT_KEYS:
        assert history[-1][f"test/{k}"] == pytest.approx(ref[k], rel=1e-9, abs=1e-12), k
    final = evaluate_final(
        cache.val_logits, cache.val_labels, cache.test_logits, cache.test_labels, posthoc={"ts": {}}
    )
    assert final.metrics["posthoc/ts/T"] > 0 and "test/ece@ts" in final.metrics


def test_image_only_options_are_refused_in_one_line(root: Path) -> None:
    from calibtune._validate import ValidationError

    data = {"name": "20newsgroups", "root": str(root)}
    with pytest.raises(ValidationError) as e:
        _config(root, data={**data, "ood": ["svhn"]})
    assert str(e.value) == (
        "data.ood: expected [] (20newsgroups is text; the OOD sets are images or signals), "
        "got ['svhn']"
    )
    with pytest.raises(ValidationError, match=r"^data.shift: expected \[\] \(no 20newsgroups"):
        _config(root, data={**data, "shift": ["cifar10c-fog"]})
    with pytest.raises(ValueError, match=r"input_shape: expected a length >= 21"):
        build_model("global_pool_cnn", 4, (100, 20))
