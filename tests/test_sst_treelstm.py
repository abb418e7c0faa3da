"""SST Binary and the level-batched Tree-LSTM: PTB parsing and encoding, the batched network
against a per-node recursive reference, the splits read from files in the official layout,
``calibtune data fetch sst`` from a server on 127.0.0.1, the trial config's refusals, AdaGrad,
and one-to-two-epoch training end to end on the CPU."""

from __future__ import annotations

import hashlib
import io
import random
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from calibtune.data import FETCH_SETS, FetchError, fetch, load_splits, verify_set
from calibtune.data._sources import Download, FetchSet
from calibtune.data._sst import MAX_NODES, EncodedTree, encode_tree, parse_tree
from calibtune.models import TreeLSTM, build_model
from calibtune.trial import config_from_dict
from calibtune.trial._worker import _optimizer, data_model_inputs
from tests.test_data_fetch import _Server

# --- files in the official layout -------------------------------------------------------------

WORDS = ["good", "bad", "film", "not", "fun", "dull", "a", "the", "plot", "great"]
SENTIMENT = {"good": 3, "fun": 3, "great": 4, "bad": 1, "dull": 0}


def _random_tree(rng: random.Random, n: int) -> tuple[str, int]:
    """A PTB line over ``n`` random words and its root label (the sum of its words' signs)."""
    if n == 1:
        w = rng.choice(WORDS)
        return f"({SENTIMENT.get(w, 2)} {w.capitalize() if rng.random() < 0.3 else w})", (
            SENTIMENT.get(w, 2) - 2
        )
    k = rng.randint(1, n - 1)
    (a, sa), (b, sb) = _random_tree(rng, k), _random_tree(rng, n - k)
    s = sa + sb
    label = 2 if s == 0 else (4 if s > 1 else 3) if s > 0 else (0 if s < -1 else 1)
    return f"({label} {a} {b})", s


def write_sst(root: Path, sizes: tuple[int, int, int] = (60, 20, 20), seed: int = 0) -> Path:
    """``<root>/trees/{train,dev,test}.txt`` of random binary trees (some neutral roots)."""
    rng = random.Random(seed)
    folder = root / "trees"
    folder.mkdir(parents=True, exist_ok=True)
    for name, n in zip(("train", "dev", "test"), sizes, strict=True):
        lines = [_random_tree(rng, rng.randint(1, 9))[0] for _ in range(n)]
        (folder / f"{name}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


def write_glove300(root: Path, words: list[str]) -> dict[str, np.ndarray]:
    """``<root>/glove.6B/glove.6B.300d.txt`` with a vector for each of ``words``."""
    folder = root / "glove.6B"
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1)
    vecs = {w: rng.normal(size=300).round(4).astype(np.float32) for w in words}
    text = "".join(f"{w} {' '.join(f'{v:.4f}' for v in vec)}\n" for w, vec in vecs.items())
    (folder / "glove.6B.300d.txt").write_text(text, encoding="utf-8")
    return vecs


# --- parsing and encoding ---------------------------------------------------------------------


def test_a_ptb_line_parses_to_leaves_then_internal_nodes_in_post_order() -> None:
    t = parse_tree("(1 (2 -LRB-) (0 (2 Not) (1 (3 good) (2 -RRB-))))")
    assert t == EncodedTree(
        ("(", "not", "good", ")"), (2, 2, 3, 2, 1, 0, 1), ((2, 3), (1, 4), (0, 5))
    )
    row = encode_tree(t, [7, 8, 9, 10])
    assert row.shape == (4, MAX_NODES) and row.dtype == np.int64
    assert row[:, :7].tolist() == [
        [7, 8, 9, 10, 0, 0, 0],
        [-1, -1, -1, -1, 2, 1, 0],
        [-1, -1, -1, -1, 3, 4, 5],
        [0, 0, 0, 0, 1, 2, 3],
    ]
    assert (row[3, 7:] == -1).all() and (row[0, 7:] == 0).all()


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("(2 (3 a) (2 b) (1 c))", "a node with 3 children"),
        ("(2 (3 (1 a)))", "a node with 1 children"),
        ("(7 a)", "label '7'"),
        ("(2 (3 a) (2 b)", "a missing"),
        ("(2 a) (3 b)", "text after the tree"),
        ("", "an empty line"),
    ],
)
def test_anything_but_a_binary_ptb_tree_is_refused_naming_the_line(line: str, why: str) -> None:
    with pytest.raises(ValueError, match=rf"sst: train.txt:4: expected a binary PTB tree.*{why}"):
        parse_tree(line, "train.txt:4")


def test_a_sentence_longer_than_a_row_is_refused() -> None:
    line = "(2 a)"
    for _ in range(64):
        line = f"(2 {line} (2 b))"
    with pytest.raises(ValueError, match="sst: a sentence of 65 tokens; expected at most 64"):
        encode_tree(parse_tree(line), [2] * 65)


# --- the level-batched network equals a per-node recursive one --------------------------------


def _reference_root(net: TreeLSTM, tree: EncodedTree, ids: list[int]) -> torch.Tensor:
    """The root's h computed node by node, recursively, as the authors' code does."""
    n = len(tree.words)

    def state(k: int) -> tuple[torch.Tensor, torch.Tensor]:
        if k < n:
            x = net.embedding.weight[ids[k]].view(1, -1)
            c = x @ net.leaf.weight[: net.hidden].T + net.leaf.bias[: net.hidden]
            o = torch.sigmoid(x @ net.leaf.weight[net.hidden :].T + net.leaf.bias[net.hidden :])
            return o * torch.tanh(c), c
        (lh, lc), (rh, rc) = state(tree.children[k - n][0]), state(tree.children[k - n][1])
        hid = net.hidden
        wl, bl, wr, br = (
            net.compose_left.weight,
            net.compose_left.bias,
            net.compose_right.weight,
            net.compose_right.bias,
        )

        def gate(g: int) -> torch.Tensor:
            s = slice(g * hid, (g + 1) * hid)
            return lh @ wl[s].T + bl[s] + rh @ wr[s].T + br[s]

        c = (
            torch.sigmoid(gate(0)) * torch.tanh(gate(3))
            + torch.sigmoid(gate(1)) * lc
            + torch.sigmoid(gate(2)) * rc
        )
        return torch.tanh(c), c

    return state(n + len(tree.children) - 1)[0] if tree.children else state(0)[0]


def test_the_level_batched_tree_lstm_equals_the_recursive_reference() -> None:
    torch.manual_seed(0)
    rng = random.Random(3)
    lines = ["(3 great)", "(1 (2 (2 not) (3 good)) (2 .))"]
    lines += [_random_tree(rng, n)[0] for n in (2, 5, 9, 13)]
    trees = [parse_tree(line) for line in lines]
    ids = [[rng.randrange(2, 30) for _ in t.words] for t in trees]
    x = torch.from_numpy(np.stack([encode_tree(t, i) for t, i in zip(trees, ids, strict=True)]))
    net = TreeLSTM(num_classes=2, hidden=7, embedding_dim=5, vocab_size=30).double().eval()
    batched = net.root_states(x)
    ref = torch.cat([_reference_root(net, t, i) for t, i in zip(trees, ids, strict=True)])
    torch.testing.assert_close(batched, ref, rtol=0, atol=1e-6)
    # the same gradients too (the in-place state table keeps autograd exact)
    w = torch.randn_like(ref)
    params = [p for n, p in net.named_parameters() if not n.startswith("fc.")]
    g_batched = torch.autograd.grad((batched * w).sum(), params)
    g_ref = torch.autograd.grad((ref * w).sum(), params)
    for a, b in zip(g_batched, g_ref, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    # a tree's logits do not depend on the batch it sits in
    torch.testing.assert_close(net(x[3:4]), net(x)[3:4], rtol=0, atol=1e-12)


def test_the_network_starts_from_the_given_word_vectors() -> None:
    table = torch.randn(12, 6)
    net = build_model("treelstm", 2, (4, MAX_NODES), embeddings=table, hidden=4)
    assert torch.equal(net.embedding.weight.detach(), table)
    assert net.embedding.weight.requires_grad  # tuned, as in the paper
    with pytest.raises(ValueError, match=r"treelstm: input_shape: expected \(4, N\) encoded"):
        build_model("treelstm", 2, (3, 32, 32))


# --- the splits from files in the official layout ---------------------------------------------


@pytest.fixture(scope="module")
def sst_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sst")
    write_sst(root)
    write_glove300(root, ["good", "bad", "film", "not", "(", "the"])
    return root


def test_the_splits_drop_neutral_roots_and_label_by_the_root(sst_root: Path) -> None:
    s = load_splits("sst", root=sst_root)
    for name, split in (("train", s.train), ("dev", s.val), ("test", s.test)):
        lines = (sst_root / "trees" / f"{name}.txt").read_text().splitlines()
        roots = [int(line[1]) for line in lines]
        kept = [r for r in roots if r != 2]
        x, y = split.tensors
        assert len(split) == len(kept) and x.shape == (len(kept), 4, MAX_NODES)
        assert y.tolist() == [int(r > 2) for r in kept]
    assert (s.num_classes, s.input_shape) == (2, (4, MAX_NODES))
    # rows 0/1 padding/unknown, then GloVe's words, then the others from U(-0.05, 0.05)
    vocab, table = s.vocab, s.embeddings
    glove = write_glove300(sst_root / "again", ["good", "bad", "film", "not", "(", "the"])
    assert s.glove_found == 5 and "(" not in vocab  # "(" never occurs in these trees
    for w in ("good", "bad", "film", "not", "the"):
        torch.testing.assert_close(table[vocab[w]], torch.from_numpy(glove[w]))
    others = [vocab[w] for w in ("fun", "dull", "a", "plot", "great")]
    assert min(others) >= 2 + 5 and table[others].abs().max() <= 0.05
    assert torch.equal(data_model_inputs(s)["embeddings"], table)
    # leaves map to their words' rows (lower-cased)
    first = (sst_root / "trees" / "train.txt").read_text().splitlines()
    t = next(parse_tree(line) for line in first if int(line[1]) != 2)
    assert s.train.tensors[0][0, 0, : len(t.words)].tolist() == [vocab[w] for w in t.words]


def test_missing_files_say_how_to_fetch_them(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"sst: dataset files not found: .*calibtune data fetch"):
        load_splits("sst", root=tmp_path)


# --- calibtune data fetch sst from 127.0.0.1 --------------------------------------------------


def _zip_trees(folder: Path) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for p in sorted(folder.iterdir()):
            z.write(p, f"trees/{p.name}")
    return buf.getvalue()


def test_fetch_checks_the_sha256_and_unpacks_the_official_layout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = FETCH_SETS["sst"]
    assert real.downloads[0].url == "https://nlp.stanford.edu/sentiment/trainDevTestTrees_PTB.zip"
    assert len(real.downloads[0].sha256) == 64 and real.folder == "trees"
    archive = _zip_trees(write_sst(tmp_path / "src"))
    server = _Server()
    try:
        server.files["/official/trainDevTestTrees_PTB.zip"] = archive
        url = f"{server.url}/official/trainDevTestTrees_PTB.zip"

        def row(sha: str) -> FetchSet:
            d = Download("trainDevTestTrees_PTB.zip", url, "", True, sha256=sha)
            return FetchSet("sst", real.title, (d,), "trees", {}, "", "the test")

        monkeypatch.delenv("CALIBTUNE_DATA_MIRROR", raising=False)
        monkeypatch.setitem(FETCH_SETS, "sst", row("0" * 64))
        refused = r"sst: .*: expected sha256 0{64}, got [0-9a-f]{64} \(the download was removed"
        with pytest.raises(FetchError, match=refused):
            fetch("sst", root=tmp_path / "data")
        assert not (tmp_path / "data" / "trees").exists()
        monkeypatch.setitem(FETCH_SETS, "sst", row(hashlib.sha256(archive).hexdigest()))
        done = fetch("sst", root=tmp_path / "data")
        assert done.action == "fetched"
        for name in ("train.txt", "dev.txt", "test.txt"):
            got = (tmp_path / "data" / "trees" / name).read_bytes()
            assert got == (tmp_path / "src" / "trees" / name).read_bytes()
        assert verify_set("sst", tmp_path / "data").status == "ok"
        assert fetch("sst", root=tmp_path / "data").action == "present"
        # a mirror serves the same file name; a changed file is refused at load
        (tmp_path / "data" / "trees" / "dev.txt").write_text("(3 good)\n")
        with pytest.raises(ValueError, match=r"sst: .*dev.txt changed since it was fetched"):
            load_splits("sst", root=tmp_path / "data")
    finally:
        server.httpd.shutdown()
        server.httpd.server_close()


# --- the trial config ---------------------------------------------------------------------------


def _raw(**over: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {"data": {"name": "sst"}, "model": {"name": "treelstm"}}
    raw.update(over)
    return raw


@pytest.mark.parametrize(
    ("over", "match"),
    [
        ({"model": {"name": "mlp"}}, r"model.name: expected one of treelstm \(data.name sst is"),
        ({"data": {"name": "digits"}}, r"model.name: expected a network for data.name digits"),
        ({"data": {"name": "sst", "ood": ["svhn"]}}, r"data.ood: expected \[\] \(sst is text"),
        ({"data": {"name": "sst", "shift": ["digits_noise"]}}, r"data.shift: expected \[\]"),
        ({"loss": {"name": "regmixup"}}, r"loss.name: expected a loss that does not mix inputs"),
        (
            {"model": {"name": "treelstm", "params": {"embeddings": [1]}}},
            r"model.params.embeddings: expected no value \(it comes from the dataset\)",
        ),
    ],
)
def test_options_that_cannot_read_trees_are_refused_in_one_line(over: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match) as err:
        config_from_dict(_raw(**over))
    assert "\n" not in str(err.value)


def test_adagrad_is_an_optimizer_choice() -> None:
    cfg = config_from_dict(_raw(optimizer={"name": "adagrad", "lr": 0.05, "weight_decay": 1e-4}))
    opt = _optimizer(cfg, torch.nn.Linear(2, 2).parameters())
    assert isinstance(opt, torch.optim.Adagrad)
    assert (opt.defaults["lr"], opt.defaults["weight_decay"]) == (0.05, 1e-4)


# --- one to two epochs end to end on the CPU ----------------------------------------------------


def test_sst_trains_end_to_end_on_the_cpu(sst_root: Path) -> None:
    from calibtune.metrics import REPORT_KEYS
    from calibtune.training import LoopSpec, evaluate_final, train_epochs

    cfg = config_from_dict(
        _raw(
            data={"name": "sst", "root": str(sst_root)},
            model={"name": "treelstm", "params": {"hidden": 16}},
            loss={"name": "focal", "params": {"gamma": 3.0}},
            optimizer={"name": "adagrad", "lr": 0.05, "weight_decay": 1e-4},
            train={"epochs": 2, "batch_size": 25},
        )
    )
    torch.manual_seed(0)
    s = load_splits("sst", root=sst_root)
    net = build_model("treelstm", s.num_classes, s.input_shape, hidden=16, **data_model_inputs(s))
    before = net.embedding.weight.detach().clone()
    history: list[dict[str, Any]] = []
    spec = LoopSpec(
        model=net,
        loss_fn=cfg.loss.build(),
        optimizer=_optimizer(cfg, net.parameters()),
        lr_at=lambda e: 0.05,
        train_set=s.train,
        val_set=s.val,
        test_set=s.test,
        epochs=2,
        batch_size=25,
        augment=s.augment,
        seed=1,
    )
    cache = train_epochs(spec, on_epoch_end=lambda e, m, c: history.append(m))
    assert [h["epoch"] for h in history] == [1, 2]
    assert cache.test_logits.shape == (len(s.test), 2)
    assert not torch.equal(net.embedding.weight.detach(), before)  # the vectors are tuned
    final = evaluate_final(
        cache.val_logits, cache.val_labels, cache.test_logits, cache.test_labels, posthoc={"ts": {}}
    )
    for k in REPORT_KEYS:
        assert f"test/{k}" in final.metrics and f"test/{k}@ts" in final.metrics
