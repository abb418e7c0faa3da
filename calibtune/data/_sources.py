"""Where each data set comes from: official URLs and published checksums, as data.

One row per set that ``calibtune data fetch`` knows (`FETCH_SETS`): the files to download
(URL, file name, MD5 of the file as published), whether each is an archive to unpack into the
root or a plain file placed there, and the files calibtune's loaders read afterwards with their
per-file MD5 where one is published. Every checksum names its source in ``checksum_source``;
none is computed here.

Sources of the values:

* CIFAR-10 / CIFAR-100 archives and batches, SVHN ``.mat`` files: torchvision 0.29
  (``torchvision.datasets.CIFAR10.tgz_md5``, ``.train_list``, ``.test_list``, ``.meta``;
  ``CIFAR100`` alike; ``SVHN.split_list``) — the values torchvision has checked since 2017;
  ``tests/test_data_fetch.py`` compares this table with the installed torchvision.
* CIFAR-10-C / CIFAR-100-C archives: the MD5 Zenodo lists for ``CIFAR-10-C.tar`` (record
  2535967) and ``CIFAR-100-C.tar`` (record 3555552), the same values torch-uncertainty pins
  (``torch_uncertainty/datasets/classification/cifar/cifar_c.py``: ``CIFAR10C.tgz_md5``,
  ``CIFAR100C.tgz_md5``); per-``.npy`` MD5s from torch-uncertainty's ``ctest_list``.
* SST (``trainDevTestTrees_PTB.zip``): Stanford publishes no checksum; the SHA-256 is the one
  Flux.jl pins for the same URL (``src/data/sentiment.jl``), no MD5 is published anywhere we
  found, so the archive is checked by SHA-256 (`Download.sha256`).
* Tiny-ImageNet: Stanford publishes no checksum for ``tiny-imagenet-200.zip``; the MD5 is the
  one the community pins (Avalanche's ``TinyImagenet.md5`` and torch-uncertainty's
  ``TinyImageNet.tgz_md5``), no per-file values exist, so its files are checked against the
  digests recorded when calibtune fetched them.
* GloVe 6B (``glove.6B.zip``, 862,182,613 bytes): Stanford publishes no checksum; the MD5 is the
  one independent downloaders pin for the same URL (LEAF's ``sent140`` download in
  federated-learning code bases, the atnlp project's ``MD5ZIP``, shell scripts that check
  ``md5sum``), no per-file values exist (the digests recorded at fetch are checked).
* 20 Newsgroups (``20news-19997.tar.gz``, the original 19,997-document collection, 17,332,201
  bytes): no checksum on Jason Rennie's page; the SHA-256 is the one Hugging Face ``datasets``
  pinned for the same URL (``datasets/newsgroup/dataset_infos.json``, ``download_checksums``;
  its ``20news-bydate.tar.gz`` value there equals scikit-learn's ``ARCHIVE.checksum``), checked
  by SHA-256 (`Download.sha256`); per-file: none published.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["FETCH_SETS", "Download", "FetchSet", "fetch_set"]


@dataclass(frozen=True)
class Download:
    """One file on a server: ``url`` (its last path part is ``file``, also the name a mirror
    must serve), its published ``md5`` (or, where only one is published, ``sha256``) and
    whether it is an archive to ``extract`` into the root (else it is placed at
    ``<root>/<file>``)."""

    file: str
    url: str
    md5: str
    extract: bool
    # the published SHA-256 where no MD5 is published (``md5`` then ""): checked instead
    sha256: str = ""


@dataclass(frozen=True)
class FetchSet:
    """A data set as ``calibtune data fetch`` knows it: what to download, the top ``folder``
    its archive unpacks to (None for plain files), the files the loaders read (paths relative
    to the root) with their published MD5 (``""``: none published), the approximate download
    size and where each checksum comes from."""

    name: str
    title: str
    downloads: tuple[Download, ...]
    folder: str | None
    files: dict[str, str] = field(default_factory=dict)
    size: str = ""
    checksum_source: str = ""
    # the archive has no top folder (glove.6B.zip): its members are unpacked into ``folder``
    flat: bool = False


def _cifar_c(name: str, folder: str, record: str, md5: str, npy: dict[str, str]) -> FetchSet:
    url = f"https://zenodo.org/records/{record}/files/{folder}.tar"
    files = {f"{folder}/{c}.npy": digest for c, digest in sorted(npy.items())}
    cls = folder.replace("-", "")  # torch-uncertainty's class: CIFAR10C, CIFAR100C
    return FetchSet(
        name,
        f"{folder} (Hendrycks & Dietterich 2019), 19 corruptions × 5 severities",
        (Download(f"{folder}.tar", url, md5, True),),
        folder,
        files,
        "2.7 GiB",
        f"archive: Zenodo record {record} (as listed there; torch-uncertainty {cls}.tgz_md5); "
        f"per-file: torch-uncertainty {cls}.ctest_list",
    )


_CIFAR10C_NPY = {
    "fog": "7b397314b5670f825465fbcd1f6e9ccd",
    "jpeg_compression": "2b9cc4c864e0193bb64db8d7728f8187",
    "zoom_blur": "6ea8e63f1c5cdee1517533840641641b",
    "speckle_noise": "ef00b87611792b00df09c0b0237a1e30",
    "glass_blur": "7361fb4019269e02dbf6925f083e8629",
    "spatter": "8a5a3903a7f8f65b59501a6093b4311e",
    "shot_noise": "3a7239bb118894f013d9bf1984be7f11",
    "defocus_blur": "7d1322666342a0702b1957e92f6254bc",
    "elastic_transform": "9421657c6cd452429cf6ce96cc412b5f",
    "gaussian_blur": "c33370155bc9b055fb4a89113d3c559d",
    "frost": "31f6ab3bce1d9934abfb0cc13656f141",
    "saturate": "1cfae0964219c5102abbb883e538cc56",
    "brightness": "0a81ef75e0b523c3383219c330a85d48",
    "snow": "bb238de8555123da9c282dea23bd6e55",
    "gaussian_noise": "ecaf8b9a2399ffeda7680934c33405fd",
    "motion_blur": "fffa5f852ff7ad299cfe8a7643f090f4",
    "contrast": "3c8262171c51307f916c30a3308235a8",
    "impulse_noise": "2090e01c83519ec51427e65116af6b1a",
    "labels": "c439b113295ed5254878798ffe28fd54",
    "pixelate": "0f14f7e2db14288304e1de10df16832f",
}
_CIFAR100C_NPY = {
    "fog": "4efc7ebd5e82b028bdbe13048e3ea564",
    "jpeg_compression": "c851b7f1324e1d2ffddeb76920576d11",
    "zoom_blur": "0204613400c034a81c4830d5df81cb82",
    "speckle_noise": "e3f215b1a0f9fd9fd6f0d1cf94a7ce99",
    "glass_blur": "0bf384f38e5ccbf8dd479d9059b913e1",
    "spatter": "12ccf41d62564d36e1f6a6ada5022728",
    "shot_noise": "b0a1fa6e1e465a747c1b204b1914048a",
    "defocus_blur": "d923e3d9c585a27f0956e2f2ad832564",
    "elastic_transform": "a0792bd6581f6810878be71acedfc65a",
    "gaussian_blur": "5204ba0d557839772ef5a4196a052c3e",
    "frost": "3a39c6823bdfaa0bf8b12fe7004b8117",
    "saturate": "c0697e9fdd646916a61e9c312c77bf6b",
    "brightness": "f22d7195aecd6abb541e27fca230c171",
    "snow": "0237be164583af146b7b144e73b43465",
    "gaussian_noise": "ecc4d366eac432bdf25c024086f5e97d",
    "motion_blur": "732a7e2e54152ff97c742d4c388c5516",
    "contrast": "322bb385f1d05154ee197ca16535f71e",
    "impulse_noise": "3b3c210ddfa0b5cb918ff4537a429fef",
    "labels": "bb4026e9ce52996b95f439544568cdb2",
    "pixelate": "96c00c60f144539e14cffb02ddbd0640",
}
_KRIZ = "https://www.cs.toronto.edu/~kriz"
#: MD5 of the official glove.6B.zip (862,182,613 bytes), as pinned by independent downloaders
GLOVE6B_MD5 = "056ea991adb4740ac6bf1b6d9b50408b"
#: SHA-256 of 20news-19997.tar.gz (17,332,201 bytes), Hugging Face datasets' dataset_infos.json
NEWSGROUPS_SHA256 = "ab7bbf82b7831f7dbb1a09d9312f66fa78565c8de25526999b0d66f69d37e414"
_SVHN = "http://ufldl.stanford.edu/housenumbers"  # the host serves plain HTTP; MD5 still applies

FETCH_SETS: dict[str, FetchSet] = {
    s.name: s
    for s in (
        FetchSet(
            "cifar10",
            "CIFAR-10, python version (Krizhevsky 2009)",
            (
                Download(
                    "cifar-10-python.tar.gz",
                    f"{_KRIZ}/cifar-10-python.tar.gz",
                    "c58f30108f718f92721af3b95e74349a",
                    True,
                ),
            ),
            "cifar-10-batches-py",
            {
                "cifar-10-batches-py/data_batch_1": "c99cafc152244af753f735de768cd75f",
                "cifar-10-batches-py/data_batch_2": "d4bba439e000b95fd0a9bffe97cbabec",
                "cifar-10-batches-py/data_batch_3": "54ebc095f3ab1f0389bbae665268c751",
                "cifar-10-batches-py/data_batch_4": "634d18415352ddfa80567beed471001a",
                "cifar-10-batches-py/data_batch_5": "482c414d41f54cd18b22e5b47cb7c3cb",
                "cifar-10-batches-py/test_batch": "40351d587109b95175f43aff81a1287e",
                "cifar-10-batches-py/batches.meta": "5ff9c542aee3614f3951f8cda6e48888",
            },
            "163 MiB",
            "torchvision CIFAR10.tgz_md5, .train_list, .test_list, .meta",
        ),
        FetchSet(
            "cifar100",
            "CIFAR-100, python version (Krizhevsky 2009)",
            (
                Download(
                    "cifar-100-python.tar.gz",
                    f"{_KRIZ}/cifar-100-python.tar.gz",
                    "eb9058c3a382ffc7106e4002c42a8d85",
                    True,
                ),
            ),
            "cifar-100-python",
            {
                "cifar-100-python/train": "16019d7e3df5f24257cddd939b257f8d",
                "cifar-100-python/test": "f0ef6b0ae62326f3e7ffdfab6717acfc",
                "cifar-100-python/meta": "7973b15100ade9c7d40fb424638fde48",
            },
            "161 MiB",
            "torchvision CIFAR100.tgz_md5, .train_list, .test_list, .meta",
        ),
        FetchSet(
            "svhn",
            "SVHN cropped digits, format 2, train and test (Netzer et al. 2011)",
            (
                Download(
                    "train_32x32.mat",
                    f"{_SVHN}/train_32x32.mat",
                    "e26dedcc434d2e4c54c9b2d4a06d8373",
                    False,
                ),
                Download(
                    "test_32x32.mat",
                    f"{_SVHN}/test_32x32.mat",
                    "eb5a983be6a315427106f1b164d9cef3",
                    False,
                ),
            ),
            None,
            {
                "train_32x32.mat": "e26dedcc434d2e4c54c9b2d4a06d8373",
                "test_32x32.mat": "eb5a983be6a315427106f1b164d9cef3",
            },
            "235 MiB",
            "torchvision SVHN.split_list",
        ),
        _cifar_c(
            "cifar10c", "CIFAR-10-C", "2535967", "56bf5dcef84df0e2308c6dcbcbbd8499", _CIFAR10C_NPY
        ),
        _cifar_c(
            "cifar100c",
            "CIFAR-100-C",
            "3555552",
            "11f0ed0f1191edbf9fa23466ae6021d3",
            _CIFAR100C_NPY,
        ),
        FetchSet(
            "tiny_imagenet",
            "Tiny-ImageNet, 200 classes, 64×64 (Stanford CS231n)",
            (
                Download(
                    "tiny-imagenet-200.zip",
                    "http://cs231n.stanford.edu/tiny-imagenet-200.zip",
                    "90528d7ca1a48142e341f4ef8d21d0de",
                    True,
                ),
            ),
            "tiny-imagenet-200",
            {},
            "237 MiB",
            "archive: none published by Stanford; the value Avalanche (TinyImagenet.md5) and "
            "torch-uncertainty (TinyImageNet.tgz_md5) pin; per-file: none published (the "
            "digests recorded at fetch are checked)",
        ),
        FetchSet(
            "sst",
            "Stanford Sentiment Treebank, PTB-format train/dev/test trees (Socher et al. 2013)",
            (
                Download(
                    "trainDevTestTrees_PTB.zip",
                    "https://nlp.stanford.edu/sentiment/trainDevTestTrees_PTB.zip",
                    "",
                    True,
                    sha256="5c613a4f673fc74097d523a2c83f38e0cc462984d847b82c7aaf36b01cbbbfcc",
                ),
            ),
            "trees",
            {},
            "771 KiB",
            "archive: none published by Stanford; the SHA-256 Flux.jl pins "
            "(src/data/sentiment.jl, download_and_verify); per-file: none published (the "
            "digests recorded at fetch are checked)",
        ),
        FetchSet(
            "glove6b",
            "GloVe 6B word vectors, 50/100/200/300-d (Pennington, Socher & Manning 2014)",
            (
                Download(
                    "glove.6B.zip",
                    "https://nlp.stanford.edu/data/glove.6B.zip",
                    GLOVE6B_MD5,
                    True,
                ),
            ),
            "glove.6B",
            {},
            "822 MiB",
            "archive: none published by Stanford; the MD5 independent downloaders pin "
            "(LEAF sent140 download, atnlp MD5ZIP); per-file: none published (the digests "
            "recorded at fetch are checked)",
            flat=True,
        ),
        FetchSet(
            "20newsgroups",
            "20 Newsgroups, original 19,997-document collection 20news-19997 (Lang 1995)",
            (
                Download(
                    "20news-19997.tar.gz",
                    "http://qwone.com/~jason/20Newsgroups/20news-19997.tar.gz",
                    "",
                    True,
                    sha256=NEWSGROUPS_SHA256,
                ),
            ),
            "20_newsgroups",
            {},
            "17 MiB",
            "archive: none published by J. Rennie; the SHA-256 Hugging Face datasets pins "
            "(datasets/newsgroup/dataset_infos.json, download_checksums); per-file: none "
            "published (the digests recorded at fetch are checked)",
        ),
    )
}


def fetch_set(name: str) -> FetchSet:
    """The `FetchSet` called ``name``; ``ValueError`` listing the known names otherwise.

    >>> fetch_set("cifar10").folder
    'cifar-10-batches-py'
    """
    if name not in FETCH_SETS:
        raise ValueError(f"data set: expected one of {', '.join(FETCH_SETS)}, got {name!r}")
    return FETCH_SETS[name]
