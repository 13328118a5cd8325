"""growmem.data: finding, downloading, verifying and reading MNIST, Fashion-MNIST, CIFAR-10/100.

Downloads run the real code against a local HTTP server (127.0.0.1, a free port) serving small
files in each dataset's true format; no test reaches the internet (a guard refuses other hosts).
"""
import dataclasses
import gzip
import hashlib
import json
import io
import os
import pickle
import socket
import struct
import tarfile
import threading
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

import growmem.data as data
from growmem.data import CorruptDatasetError, DatasetNotFoundError, datasets, mnist

IDX_FILES = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
             "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")


# --------------------------------------------------------------------------- helpers

class Server:
    """A local HTTP server: ``routes[path] = (kind, body, arg)``; ``requests`` lists the paths asked for.

    kinds: "ok" (body with its Content-Length), "status" (an error status ``body``), "truncate"
    (announces ``len(body)`` bytes, sends ``arg`` of them and closes), "nolength" (no Content-Length).
    A ``Range: bytes=N-`` request is answered 206 with the body from byte N when ``ranges`` is true
    (``ranges_asked`` lists them); otherwise the whole body is sent (200), as servers without ranges do."""

    def __init__(self):
        self.routes, self.requests, self.ranges, self.ranges_asked = {}, [], True, []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                outer.requests.append(self.path)
                kind, body, arg = outer.routes.get(self.path, ("status", 404, None))
                if kind == "status":
                    self.send_error(body)
                    return
                asked = self.headers.get("Range")
                start = 0
                if asked:
                    outer.ranges_asked.append((self.path, asked))
                    if outer.ranges and asked.startswith("bytes=") and asked.endswith("-"):
                        start = int(asked[len("bytes="):-1])
                self.send_response(206 if start else 200)
                body = body[start:]
                arg = None if arg is None else max(arg - start, 0)
                if kind != "nolength":
                    self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body[:arg] if kind == "truncate" else body)
                self.wfile.flush()
                self.close_connection = True

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def mirror(self, prefix, files, kind="ok", arg=None):
        for name, body in files.items():
            self.routes[f"/{prefix}/{name}"] = (kind, body, arg)
        return f"{self.url}{prefix}/"

    def stop(self):
        if self.thread.is_alive():
            self.httpd.shutdown()
            self.httpd.server_close()
            self.thread.join()


@pytest.fixture
def server():
    s = Server()
    yield s
    s.stop()


class _Root(type(Path())):
    """The per-test $GROWMEM_DATA folder, carrying ``calls``: the URLs the loader opened."""


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """Every test: its own $GROWMEM_DATA and cache home, no proxies, no Debian Fashion-MNIST, and a
    guard that lets downloads reach 127.0.0.1 only. Returns the $GROWMEM_DATA folder."""
    root = _Root(tmp_path / "growmem_data")
    monkeypatch.setenv("GROWMEM_DATA", str(root))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("GROWMEM_DATA_CHECKSUMS", raising=False)   # the pinned checksums, unless a test overrides
    for var in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setitem(datasets.DATASETS, "fashion_mnist",
                        dataclasses.replace(datasets.DATASETS["fashion_mnist"], system_dirs=()))
    real_urlopen = urllib.request.urlopen
    calls = []

    def guarded(req, *a, **k):
        url = getattr(req, "full_url", req)   # a str or a urllib.request.Request
        calls.append(url)
        host = urllib.parse.urlsplit(url).hostname
        assert host == "127.0.0.1", f"a test tried to reach {url}"
        return real_urlopen(req, *a, **k)

    monkeypatch.setattr(urllib.request, "urlopen", guarded)
    root.calls = calls
    return root


def tree(folder):
    """Every file and folder under ``folder`` (relative paths, hidden ones included)."""
    folder = Path(folder)
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) if folder.exists() else []


def idx(arr, code=0x08):
    arr = np.asarray(arr)
    return struct.pack(">BBBB", 0, 0, code, arr.ndim) + struct.pack(f">{arr.ndim}I", *arr.shape) + \
        arr.astype(np.uint8).tobytes()


def tiny_idx(seed=0, n_train=12, n_test=5):
    """A tiny MNIST-format set: ``(gz files, sha256-of-content checksums, arrays)``."""
    rng = np.random.default_rng(seed)
    arrays = {"train": (rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8), rng.integers(0, 10, n_train)),
              "test": (rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8), rng.integers(0, 10, n_test))}
    raw = dict(zip(IDX_FILES, (idx(arrays["train"][0]), idx(arrays["train"][1]),
                               idx(arrays["test"][0]), idx(arrays["test"][1]))))
    files = {k: gzip.compress(v, mtime=0) for k, v in raw.items()}
    return files, {k: hashlib.sha256(v).hexdigest() for k, v in raw.items()}, arrays


def _pickle(obj):
    return pickle.dumps(obj, protocol=2)


def tiny_cifar(name, seed=0, bad_label=None):
    """A tiny CIFAR-format archive: ``(archive bytes, md5 checksums, {split: (uint8 chw rows, labels)}, members)``."""
    spec = datasets.DATASETS[name]
    rng = np.random.default_rng(seed)
    members, arrays = {}, {}
    if name == "cifar10":
        parts = {f"data_batch_{i}": 3 for i in range(1, 6)}
        parts["test_batch"] = 4
        for member, n in parts.items():
            x, y = rng.integers(0, 256, (n, 3072), dtype=np.uint8), rng.integers(0, 10, n).tolist()
            if bad_label is not None and member == "data_batch_1":
                y[0] = bad_label
            members[member] = _pickle({b"batch_label": member.encode(), b"data": x, b"labels": y})
            split = "test" if member == "test_batch" else "train"
            px, py = arrays.get(split, (np.zeros((0, 3072), np.uint8), []))
            arrays[split] = (np.concatenate([px, x]), py + y)
        members["batches.meta"] = _pickle({b"label_names": [b"airplane"] * 10, b"num_vis": 3072})
    else:
        for member, n in (("train", 6), ("test", 4)):
            x = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
            fine, coarse = rng.integers(0, 100, n).tolist(), rng.integers(0, 20, n).tolist()
            members[member] = _pickle({b"data": x, b"fine_labels": fine, b"coarse_labels": coarse})
            arrays[member] = (x, fine, coarse)
        members["meta"] = _pickle({b"fine_label_names": [b"x"] * 100, b"coarse_label_names": [b"y"] * 20})
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        d = tarfile.TarInfo(spec.folder)
        d.type = tarfile.DIRTYPE
        tf.addfile(d)
        for member, body in members.items():
            info = tarfile.TarInfo(f"{spec.folder}/{member}")
            info.size = len(body)
            tf.addfile(info, io.BytesIO(body))
    archive = buf.getvalue()
    sums = {spec.files[0]: hashlib.md5(archive).hexdigest(), **{m: hashlib.md5(b).hexdigest() for m, b in members.items()}}
    return archive, sums, arrays, members


def hwc(rows):
    """The loader's layout of CIFAR's channel-first rows: (n, 32, 32, 3) in [0, 1]."""
    return rows.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1).astype(np.float32) / 255


def closed_port_url():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/"


# --------------------------------------------------------------------------- the real MNIST

def test_real_mnist_from_growmem_data_and_the_legacy_api(real_mnist):
    x, y = data.load("mnist", "test", download=False)
    assert x.shape == (10000, 784) and x.dtype == np.float32 and y.dtype == np.int32
    assert 0.0 <= x.min() and x.max() == 1.0 and sorted(set(y.tolist())) == list(range(10))
    assert y[:10].tolist() == [7, 2, 1, 0, 4, 1, 4, 9, 5, 9]  # the published first test labels
    x2, y2 = mnist.load("test", limit=100, flatten=False)
    assert x2.shape == (100, 28, 28) and np.array_equal(x2.reshape(100, -1), x[:100]) and np.array_equal(y2, y[:100])
    assert mnist.available() and mnist.find() == real_mnist / "mnist"
    assert mnist.read_idx(real_mnist / "mnist" / "t10k-labels-idx1-ubyte.gz").shape == (10000,)


def test_the_shared_folder_is_not_a_fallback(monkeypatch):
    monkeypatch.delenv("GROWMEM_DATA", raising=False)
    dirs = mnist.candidate_dirs()
    assert not any("shared" in d.parts for d in dirs)  # no ../shared/data/mnist
    assert not mnist.available()
    with pytest.raises(DatasetNotFoundError):
        mnist.load("test")


# --------------------------------------------------------------------------- where files are looked for

def test_search_order_and_download_folder(tmp_path, monkeypatch, isolated):
    xdg = tmp_path / "xdg" / "growmem"
    assert data.search_dirs("mnist") == [isolated / "mnist", isolated, xdg / "mnist"]
    assert data.search_dirs("cifar10") == [isolated / "cifar10", xdg / "cifar10"]
    assert data.cache_dir("cifar100") == isolated / "cifar100"
    assert data.search_dirs("cifar10", tmp_path) == [tmp_path / "cifar10", tmp_path]  # explicit: nowhere else
    assert data.cache_dir("mnist", tmp_path) == tmp_path / "mnist"
    monkeypatch.delenv("GROWMEM_DATA", raising=False)
    assert data.cache_dir("mnist") == xdg / "mnist"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert data.cache_dir("fashion_mnist") == tmp_path / "home" / ".cache" / "growmem" / "fashion_mnist"
    # the Debian/Ubuntu package dataset-fashion-mnist installs into /usr/share/datasets/fashion-mnist
    monkeypatch.undo()
    assert Path("/usr/share/datasets/fashion-mnist") in data.search_dirs("fashion_mnist")
    assert data.names() == ["cifar10", "cifar100", "fashion_mnist", "mnist"]
    with pytest.raises(ValueError, match="unknown dataset"):
        data.load("svhn")


def test_an_explicit_data_dir_that_does_not_exist_is_an_error_without_fallback(tmp_path, isolated, server):
    files, sums, _ = tiny_idx()
    (isolated / "mnist").mkdir(parents=True)
    for name, body in files.items():  # a good copy in $GROWMEM_DATA must not be used instead
        (isolated / "mnist" / name).write_bytes(body)
    assert data.load("mnist", "test", checksums=sums, download=False)[0].shape == (5, 784)
    url = server.mirror("m", files)
    missing = tmp_path / "no_such_dir"
    with pytest.raises(DatasetNotFoundError, match="does not exist") as e:
        data.load("mnist", "test", data_dir=missing, mirrors=[url], checksums=sums)
    assert str(missing) in str(e.value)
    assert not missing.exists() and server.requests == [] and isolated.calls == []
    assert not mnist.available(missing)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        mnist.find(missing)


def test_an_existing_explicit_data_dir_receives_the_download(tmp_path, server):
    files, sums, arrays = tiny_idx()
    url = server.mirror("m", files)
    (tmp_path / "mine").mkdir()
    x, y = data.load("mnist", "train", data_dir=tmp_path / "mine", mirrors=[url], checksums=sums)
    assert tree(tmp_path / "mine") == ["mnist"] + [f"mnist/{f}" for f in sorted(IDX_FILES)]
    assert np.array_equal(y, arrays["train"][1])


# --------------------------------------------------------------------------- downloads

@pytest.mark.parametrize("name", ["mnist", "fashion_mnist"])
def test_download_verifies_caches_and_the_second_load_uses_no_network(name, isolated, server):
    files, sums, arrays = tiny_idx(seed=1)
    url = server.mirror("mirror", files)
    x, y = data.load(name, "train", mirrors=[url], checksums=sums)
    assert x.shape == (12, 784) and x.dtype == np.float32 and y.dtype == np.int32
    np.testing.assert_array_equal(x, arrays["train"][0].reshape(12, -1) / np.float32(255))
    np.testing.assert_array_equal(y, arrays["train"][1])
    assert tree(isolated) == [name] + [f"{name}/{f}" for f in sorted(IDX_FILES)]  # no temporary files left
    assert sorted(server.requests) == sorted(f"/mirror/{f}" for f in IDX_FILES)
    server.stop()
    n_calls = len(isolated.calls)
    xt, yt = data.load(name, "test", mirrors=[url], checksums=sums, flatten=False, limit=3)
    assert xt.shape == (3, 28, 28) and np.array_equal(yt, arrays["test"][1][:3])
    assert len(isolated.calls) == n_calls  # served from the cache


@pytest.mark.parametrize("name", ["cifar10", "cifar100"])
def test_cifar_download_extracts_verified_pickles_channel_last(name, isolated, server):
    archive, sums, arrays, members = tiny_cifar(name)
    spec = datasets.DATASETS[name]
    url = server.mirror("kriz", {spec.files[0]: archive})
    x, y = data.load(name, "train", mirrors=[url], checksums=sums, flatten=False)
    rows = arrays["train"][0]
    assert x.shape == (len(rows), 32, 32, 3) and x.dtype == np.float32
    np.testing.assert_array_equal(x, hwc(rows))
    # one known pixel: row layout is channel-major (R plane, G plane, B plane), each 32x32 row-major
    assert x[0, 2, 5, 1] == np.float32(rows[0, 1 * 1024 + 2 * 32 + 5]) / np.float32(255)
    np.testing.assert_array_equal(y, arrays["train"][1])
    assert tree(isolated) == sorted([name, f"{name}/{spec.files[0]}", f"{name}/{spec.folder}"]
                                    + [f"{name}/{spec.folder}/{m}" for m in members])
    server.stop()
    xf, yt = data.load(name, "test", mirrors=[url], checksums=sums)  # from the extracted cache
    assert xf.shape == (4, 3072)
    np.testing.assert_array_equal(xf, hwc(arrays["test"][0]).reshape(4, -1))  # flattened in (h, w, c) order
    if name == "cifar100":
        _, yc = data.load(name, "test", mirrors=[url], checksums=sums, labels="coarse")
        np.testing.assert_array_equal(yt, arrays["test"][1])
        np.testing.assert_array_equal(yc, arrays["test"][2])
    x3, _ = data.load(name, "train", checksums=sums, limit=4, download=False)
    assert x3.shape == (4, 3072)


def test_a_cifar_archive_placed_by_hand_is_verified_and_extracted_without_network(isolated):
    archive, sums, arrays, members = tiny_cifar("cifar10")
    (isolated / "cifar10").mkdir(parents=True)
    (isolated / "cifar10" / "cifar-10-python.tar.gz").write_bytes(archive)
    assert data.available("cifar10")
    x, y = data.load("cifar10", "test", checksums=sums, download=False)
    assert x.shape == (4, 3072) and isolated.calls == []
    assert sorted(os.listdir(isolated / "cifar10" / "cifar-10-batches-py")) == sorted(members)


def test_checksum_mismatch_keeps_nothing(isolated, server):
    files, sums, _ = tiny_idx(seed=0)
    other, _, _ = tiny_idx(seed=5)  # well-formed files with other content
    url = server.mirror("m", other)
    with pytest.raises(DatasetNotFoundError) as e:
        data.load("mnist", mirrors=[url], checksums=sums)
    msg = str(e.value)
    assert "checksum mismatch" in msg and f"{url}train-images-idx3-ubyte.gz" in msg and sums[IDX_FILES[0]] in msg
    assert tree(isolated) == []


def test_cifar_archive_checksum_mismatch_keeps_nothing(isolated, server):
    archive, sums, _, _ = tiny_cifar("cifar10")
    url = server.mirror("kriz", {"cifar-10-python.tar.gz": archive + b"\0"})
    with pytest.raises(DatasetNotFoundError, match="checksum mismatch: md5"):
        data.load("cifar10", mirrors=[url], checksums=sums)
    assert tree(isolated) == []


def test_a_truncated_transfer_is_refused_and_removed(isolated, server):
    files, sums, _ = tiny_idx()
    body = files[IDX_FILES[0]]
    url = server.mirror("short", {IDX_FILES[0]: body}, kind="truncate", arg=len(body) // 2)  # Content-Length lies
    with pytest.raises(DatasetNotFoundError) as e:
        data.load("mnist", mirrors=[url], checksums=sums)
    assert f"{url}{IDX_FILES[0]}" in str(e.value)
    assert "incomplete" in str(e.value).lower() or "IncompleteRead" in str(e.value)
    assert tree(isolated) == []
    # without a Content-Length the cut gzip stream itself gives it away
    url2 = server.mirror("nolen", {IDX_FILES[0]: body[:len(body) // 2]}, kind="nolength")
    with pytest.raises(DatasetNotFoundError, match="not a valid file: damaged gzip"):
        data.load("mnist", mirrors=[url2], checksums=sums)
    assert tree(isolated) == []


def test_http_500_tries_the_next_mirror_and_reports_every_url(isolated, server):
    files, sums, arrays = tiny_idx()
    broken = server.mirror("broken", {f: 500 for f in IDX_FILES}, kind="status")
    with pytest.raises(DatasetNotFoundError) as e:
        data.load("mnist", mirrors=[broken], checksums=sums)
    assert "HTTP Error 500" in str(e.value) and f"{broken}train-images-idx3-ubyte.gz" in str(e.value)
    assert tree(isolated) == []
    good = server.mirror("good", files)
    x, y = data.load("mnist", "test", mirrors=[broken, good], checksums=sums)
    assert np.array_equal(y, arrays["test"][1])
    assert f"/broken/{IDX_FILES[0]}" in server.requests and f"/good/{IDX_FILES[0]}" in server.requests
    assert tree(isolated) == ["mnist"] + [f"mnist/{f}" for f in sorted(IDX_FILES)]


def test_a_failed_file_keeps_the_verified_ones_and_the_next_load_fetches_only_the_rest(isolated, server):
    files, sums, arrays = tiny_idx()
    url = server.mirror("m", {IDX_FILES[0]: files[IDX_FILES[0]]})  # the labels are missing (404)
    with pytest.raises(DatasetNotFoundError, match="HTTP Error 404"):
        data.load("mnist", mirrors=[url], checksums=sums)
    assert tree(isolated) == ["mnist", f"mnist/{IDX_FILES[0]}"]
    server.mirror("m", files)
    server.requests.clear()
    data.load("mnist", mirrors=[url], checksums=sums)
    assert sorted(server.requests) == sorted(f"/m/{f}" for f in IDX_FILES[1:])


def test_keyboard_interrupt_during_a_download_leaves_no_temporary_file(isolated, server, monkeypatch):
    files, sums, _ = tiny_idx()
    url = server.mirror("m", files)

    def interrupted(*args):
        def verify(path):
            assert path.name.endswith(".part") and path.exists()  # the bytes are in the temporary file
            raise KeyboardInterrupt
        return verify

    monkeypatch.setattr(datasets, "_verifier", interrupted)
    with pytest.raises(KeyboardInterrupt):
        data.load("mnist", mirrors=[url], checksums=sums)
    assert tree(isolated) == []


def test_offline_error_names_paths_urls_the_network_error_and_how_to_place_files(tmp_path, isolated):
    url = closed_port_url()
    with pytest.raises(DatasetNotFoundError) as e:
        data.load("fashion_mnist", mirrors=[url])
    err, msg = e.value, str(e.value)
    assert isinstance(err, FileNotFoundError) and err.dataset == "fashion_mnist"
    assert "fashion_mnist not found" in msg
    for d in data.search_dirs("fashion_mnist"):
        assert str(d) in msg
    assert f"{url}train-images-idx3-ubyte.gz" in msg and "Connection refused" in msg
    target = isolated / "fashion_mnist"
    assert err.target == target and f"into {target}/" in msg
    for f in IDX_FILES:
        assert f in msg
    assert "still gzipped" in msg
    assert tree(isolated) == []


def test_offline_cifar_error_names_the_archive_and_folder(isolated):
    url = closed_port_url()
    with pytest.raises(DatasetNotFoundError) as e:
        data.load("cifar100", mirrors=[url])
    msg = str(e.value)
    assert f"{url}cifar-100-python.tar.gz" in msg and "Connection refused" in msg
    assert f"into {isolated / 'cifar100'}/" in msg and "cifar-100-python/ holds train, test, meta" in msg
    assert tree(isolated) == []


def test_download_false_never_touches_the_network(isolated, server):
    files, sums, _ = tiny_idx()
    url = server.mirror("m", files)
    for name in ("mnist", "cifar10"):
        with pytest.raises(DatasetNotFoundError, match=r"Nothing was downloaded \(download=False\)") as e:
            data.load(name, download=False, mirrors=[url], checksums=sums)
        assert e.value.attempts == []
    assert server.requests == [] and isolated.calls == [] and tree(isolated) == []
    # the official sources are named for placing the files by hand
    with pytest.raises(DatasetNotFoundError, match="https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"):
        data.load("cifar10", download=False)
    with pytest.raises(DatasetNotFoundError, match="https://ossci-datasets.s3.amazonaws.com/mnist/t10k-labels"):
        mnist.load("test")  # the legacy loader never downloads unless asked


def test_legacy_mnist_download_and_load_with_the_real_files(tmp_path, isolated, server, monkeypatch, real_mnist):
    real = real_mnist / "mnist"
    monkeypatch.setenv("GROWMEM_DATA", str(isolated))
    url = server.mirror("mnist", {f: (real / f).read_bytes() for f in IDX_FILES})
    monkeypatch.setitem(datasets.DATASETS, "mnist", dataclasses.replace(datasets.DATASETS["mnist"], mirrors=(url,)))
    x, y = mnist.load("test", download=True)  # verified against the pinned (real) checksums
    assert x.shape == (10000, 784) and tree(isolated) == ["mnist"] + [f"mnist/{f}" for f in sorted(IDX_FILES)]
    out = mnist.download(tmp_path / "dl", mirrors=[url])
    assert sorted(os.listdir(out)) == sorted(IDX_FILES)
    x2, y2 = mnist.load("test", tmp_path / "dl")
    assert np.array_equal(x, x2) and np.array_equal(y, y2)


# --------------------------------------------------------------------------- corrupt files

def _corrupt_cases():
    files, _, arrays = tiny_idx()
    imgs, labels = arrays["train"]
    gz = lambda raw: gzip.compress(raw, mtime=0)  # noqa: E731
    img, lab = IDX_FILES[0], IDX_FILES[1]
    return {
        "truncated gzip": (img, files[img][: len(files[img]) // 2], "damaged gzip file"),
        "random bytes": (img, b"\x13\x37" + np.random.default_rng(0).bytes(500), "not an IDX file"),
        "not gzip": (img, b"<html><body>404 Not Found</body></html>", "looks like an HTML page"),
        "header disagrees with size": (img, gz(idx(imgs)[:-28 * 28]), "IDX header says shape (12, 28, 28)"),
        "label count differs": (lab, gz(idx(labels[:11])), "11 labels but train-images-idx3-ubyte.gz holds 12"),
        "label out of range": (lab, gz(idx(np.r_[labels[:11], 200])), "label 200 is out of range for mnist"),
        "wrong content": (img, gz(idx(255 - imgs)), "sha256 of the decompressed content"),
        "wrong image shape": (img, gz(idx(imgs.reshape(12, 28 * 28))), "expected uint8 images of shape"),
    }


@pytest.mark.parametrize("case", sorted(_corrupt_cases()))
def test_a_corrupt_idx_file_gives_one_clear_error_naming_it(case, tmp_path, isolated):
    files, sums, _ = tiny_idx()
    fname, body, expect = _corrupt_cases()[case]
    folder = tmp_path / "mnist"
    folder.mkdir()
    for name, good in files.items():
        (folder / name).write_bytes(body if name == fname else good)
    with pytest.raises(CorruptDatasetError) as e:
        data.load("mnist", "train", data_dir=tmp_path, checksums=sums)
    msg = str(e.value)
    assert expect in msg and str(folder / fname) in msg and "Delete it and load again" in msg
    assert isinstance(e.value, ValueError) and isinstance(e.value, OSError)  # the CLI's `except OSError` shows it
    assert e.value.path == folder / fname and isolated.calls == []
    assert data.load("mnist", "test", data_dir=tmp_path, checksums=sums)[0].shape == (5, 784)  # the other split is fine


def test_read_idx_reports_header_size_disagreement_as_value_error(tmp_path):
    p = tmp_path / "x.idx"
    p.write_bytes(idx(np.zeros((3, 2), np.uint8))[:-1])
    with pytest.raises(ValueError, match="header says shape"):
        mnist.read_idx(p)
    p.write_bytes(gzip.compress(idx(np.arange(6).reshape(3, 2))))
    assert mnist.read_idx(p).tolist() == [[0, 1], [2, 3], [4, 5]]


def test_a_changed_cifar_pickle_is_refused_before_unpickling(tmp_path, isolated):
    archive, sums, _, members = tiny_cifar("cifar10")
    (isolated / "cifar10").mkdir(parents=True)
    (isolated / "cifar10" / "cifar-10-python.tar.gz").write_bytes(archive)
    data.load("cifar10", "test", checksums=sums, download=False)
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (Path.touch, (marker,))

    evil = pickle.dumps({b"data": Evil()}, protocol=2)
    batch = isolated / "cifar10" / "cifar-10-batches-py" / "test_batch"
    batch.write_bytes(evil)
    with pytest.raises(CorruptDatasetError, match="md5 of the file is") as e:
        data.load("cifar10", "test", checksums=sums, download=False)
    assert str(batch) in str(e.value) and "Delete it" in str(e.value) and not marker.exists()
    # even with a checksum that matches, only numpy arrays may be built
    with pytest.raises(CorruptDatasetError, match="refusing to load global"):
        data.load("cifar10", "test", checksums={**sums, "test_batch": hashlib.md5(evil).hexdigest()}, download=False)
    assert not marker.exists()
    batch.unlink()  # the fix the error names: delete it and load again (here from the kept archive)
    x, _ = data.load("cifar10", "test", checksums=sums, download=False)
    assert x.shape == (4, 3072) and batch.read_bytes() == members["test_batch"] and isolated.calls == []
    assert sorted(os.listdir(batch.parent)) == sorted(members)
    assert not [p for p in tree(isolated) if p.endswith((".tmp", ".part"))]  # no temporary folder left


def test_cifar_labels_out_of_range_are_reported(isolated, server):
    archive, sums, _, _ = tiny_cifar("cifar10", bad_label=10)
    url = server.mirror("kriz", {"cifar-10-python.tar.gz": archive})
    with pytest.raises(CorruptDatasetError, match="label 10 is out of range for cifar10") as e:
        data.load("cifar10", "train", mirrors=[url], checksums=sums)
    assert "data_batch_1" in str(e.value)


def test_numpy_pickles_of_every_protocol_load(isolated):
    x = np.arange(2 * 3072, dtype=np.uint8).reshape(2, 3072)
    for protocol in (2, 4, 5):
        body = pickle.dumps({b"data": x, b"labels": [1, 2]}, protocol=protocol)
        path = isolated / "test_batch"
        isolated.mkdir(exist_ok=True)
        path.write_bytes(body)
        got = datasets._load_pickle(datasets.DATASETS["cifar10"], path, {"test_batch": hashlib.md5(body).hexdigest()})
        assert np.array_equal(got[b"data"], x) and got[b"labels"] == [1, 2]


def test_decompressed_idx_files_are_accepted_and_verified_too(tmp_path):
    files, sums, arrays = tiny_idx()
    (tmp_path / "fashion_mnist").mkdir()
    assert not data.available("fashion_mnist", tmp_path)
    for name, body in files.items():  # e.g. after `gunzip *.gz`
        (tmp_path / "fashion_mnist" / name[:-3]).write_bytes(gzip.decompress(body))
    assert data.available("fashion_mnist", tmp_path)
    x, y = data.load("fashion_mnist", "test", data_dir=tmp_path, checksums=sums, download=False)
    np.testing.assert_array_equal(y, arrays["test"][1])
    with pytest.raises(CorruptDatasetError, match="sha256 of the decompressed content"):
        data.load("fashion_mnist", "test", data_dir=tmp_path, download=False)  # the real Fashion-MNIST pins


# --------------------------------------------------------------------------- growmem data (the command)

def _cli(capsys, *argv):
    from growmem.app.cli import main
    code = main(list(map(str, argv)))
    out, err = capsys.readouterr()
    return code, out, err


def _override(tmp_path, monkeypatch, sums, name="mnist"):
    f = tmp_path / "sums.json"
    f.write_text(json.dumps({name: sums}))
    monkeypatch.setenv("GROWMEM_DATA_CHECKSUMS", str(f))
    return f


def test_data_list_says_where_each_dataset_is_or_would_go(isolated, tmp_path, monkeypatch, capsys):
    files, sums, _ = tiny_idx()
    (isolated / "mnist").mkdir(parents=True)
    for name, body in files.items():
        (isolated / "mnist" / name).write_bytes(body)
    code, out, _ = _cli(capsys, "data", "list")
    assert code == 0
    lines = {line.split()[0]: line for line in out.splitlines()}
    assert sorted(lines) == data.names()
    assert f"found in {isolated / 'mnist'}" in lines["mnist"]
    assert f"would go to {isolated / 'cifar10'}" in lines["cifar10"] and "growmem data download cifar10" in lines["cifar10"]
    _override(tmp_path, monkeypatch, sums)
    code, out, _ = _cli(capsys, "data", "list", "--json")
    rows = {r["name"]: r for r in json.loads(out)}
    assert rows["mnist"]["found"] == str(isolated / "mnist") and rows["mnist"]["checksums"] == "$GROWMEM_DATA_CHECKSUMS"
    assert rows["mnist"]["bytes_on_disk"] == sum(len(b) for b in files.values())
    assert rows["fashion_mnist"]["found"] is None and rows["fashion_mnist"]["checksums"] == "pinned"


def test_data_download_into_a_file_names_the_file_and_touches_nothing(isolated, tmp_path, capsys):
    (tmp_path / "a_file").write_bytes(b"keep")
    for d in (tmp_path / "a_file", tmp_path / "a_file" / "sub"):
        code, out, err = _cli(capsys, "data", "download", "mnist", "--dir", d)
        assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
        assert f"{tmp_path / 'a_file'} is a file, not a folder" in err and "Traceback" not in err
    assert (tmp_path / "a_file").read_bytes() == b"keep" and sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]


def test_data_download_is_checksummed_and_a_second_call_fetches_nothing(isolated, tmp_path, monkeypatch, server,
                                                                       capsys):
    files, sums, arrays = tiny_idx()
    url = server.mirror("m", files)
    code, _, err = _cli(capsys, "data", "download", "mnist", "--dir", tmp_path / "d", "--mirror", url)
    assert code == 1 and "checksum mismatch" in err and "growmem data download mnist" in err   # pinned sums: refused
    assert tree(tmp_path / "d") == []                                  # nothing half-written kept
    _override(tmp_path, monkeypatch, sums)
    code, out, _ = _cli(capsys, "data", "download", "mnist", "--dir", tmp_path / "d", "--mirror", url)
    assert code == 0 and "checksums verified" in out
    assert tree(tmp_path / "d") == ["mnist"] + [f"mnist/{f}" for f in sorted(IDX_FILES)]
    x, y = data.load("mnist", "test", data_dir=tmp_path / "d", download=False)
    assert np.array_equal(y, arrays["test"][1])
    n = len(server.requests)
    code, out, _ = _cli(capsys, "data", "download", "mnist", "--dir", tmp_path / "d", "--mirror", url)
    assert code == 0 and "already in" in out and len(server.requests) == n


def test_a_mirror_that_never_answers_is_skipped_after_the_timeout(isolated, tmp_path, monkeypatch, server, capsys):
    """A mirror that accepts the connection and sends nothing: --timeout bounds the wait, the next mirror
    serves the files, and the wait is said on stderr."""
    files, sums, _ = tiny_idx()
    _override(tmp_path, monkeypatch, sums)
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)                    # connections complete in the backlog and are never answered
    try:
        start = time.monotonic()
        code, out, err = _cli(capsys, "data", "download", "mnist", "--dir", tmp_path / "d", "--timeout", "0.5",
                              "--mirror", f"http://127.0.0.1:{silent.getsockname()[1]}/m/",
                              "--mirror", server.mirror("m", files))
        took = time.monotonic() - start
    finally:
        silent.close()
    assert code == 0 and "checksums verified" in out, err
    assert took < 4 * 0.5 + 5, took                 # four files, one timeout each, then the good mirror
    assert "a mirror silent for 0.5 s is skipped" in err
    assert tree(tmp_path / "d") == ["mnist"] + [f"mnist/{f}" for f in sorted(IDX_FILES)]
    for bad, said in (("0", "must be a number of seconds > 0, got 0"), ("-1", "must be a number of seconds > 0, got -1"),
                      ("nan", "must be a number of seconds > 0, got nan"), ("soon", "'soon' is not a number")):
        code, _, err = _cli(capsys, "data", "download", "mnist", "--timeout", bad)
        assert code == 2 and said in err and "Traceback" not in err


def test_data_download_resumes_a_broken_transfer_with_a_range_request(isolated, tmp_path, monkeypatch, server,
                                                                     capsys):
    files, sums, _ = tiny_idx(n_train=200)
    _override(tmp_path, monkeypatch, sums)
    big = IDX_FILES[0]
    half = len(files[big]) // 2
    url = server.mirror("m", files)
    server.routes[f"/m/{big}"] = ("truncate", files[big], half)
    code, _, err = _cli(capsys, "data", "download", "mnist", "--dir", tmp_path, "--mirror", url)
    assert code == 1 and "run the download again to resume" in err.splitlines()[-1]
    part = tmp_path / "mnist" / f".{big}.part"
    assert part.stat().st_size == half and not (tmp_path / "mnist" / big).exists()
    code, out, _ = _cli(capsys, "data", "list", "--dir", tmp_path)
    assert f"{half / 1e6:.1f} MB of a broken transfer kept" in out
    server.routes[f"/m/{big}"] = ("ok", files[big], None)
    code, out, _ = _cli(capsys, "data", "download", "mnist", "--dir", tmp_path, "--mirror", url)
    assert code == 0, out
    assert (f"/m/{big}", f"bytes={half}-") in server.ranges_asked
    assert (tmp_path / "mnist" / big).read_bytes() == files[big] and not part.exists()


def test_data_download_starts_over_when_the_server_ignores_the_range(isolated, tmp_path, monkeypatch, server,
                                                                    capsys):
    files, sums, _ = tiny_idx(n_train=200)
    _override(tmp_path, monkeypatch, sums)
    big = IDX_FILES[0]
    (tmp_path / "mnist").mkdir()
    (tmp_path / "mnist" / f".{big}.part").write_bytes(files[big][:100])
    server.ranges = False
    url = server.mirror("m", files)
    code, out, _ = _cli(capsys, "data", "download", "mnist", "--dir", tmp_path, "--mirror", url)
    assert code == 0 and (tmp_path / "mnist" / big).read_bytes() == files[big]


def test_a_resumed_file_that_fails_its_checksum_is_not_kept(isolated, tmp_path, monkeypatch, server, capsys):
    files, sums, _ = tiny_idx(n_train=200)
    _override(tmp_path, monkeypatch, sums)
    big = IDX_FILES[0]
    (tmp_path / "mnist").mkdir()
    part = tmp_path / "mnist" / f".{big}.part"
    part.write_bytes(b"\x1f\x8b" + bytes(98))          # a damaged beginning: the finished file cannot verify
    url = server.mirror("m", files)
    code, out, err = _cli(capsys, "data", "download", "mnist", "--dir", tmp_path, "--mirror", url)
    assert code == 1 and not part.exists() and not (tmp_path / "mnist" / big).exists(), (out, err, server.requests)
    code, _, _ = _cli(capsys, "data", "download", "mnist", "--dir", tmp_path, "--mirror", url)
    assert code == 0


def test_data_verify_names_a_damaged_file_and_fails(isolated, tmp_path, monkeypatch, capsys):
    files, sums, _ = tiny_idx()
    (tmp_path / "mnist").mkdir()
    for name, body in files.items():
        (tmp_path / "mnist" / name).write_bytes(body)
    _override(tmp_path, monkeypatch, sums)
    code, out, _ = _cli(capsys, "data", "verify", "mnist", "--dir", tmp_path)
    assert code == 0 and out.count(": ok") == 4
    # the same number of labels, one changed: a valid IDX file with other content
    changed = np.asarray(tiny_idx()[2]["train"][1]).copy()
    changed[0] = (changed[0] + 1) % 10
    (tmp_path / "mnist" / IDX_FILES[1]).write_bytes(gzip.compress(idx(changed), mtime=0))
    code, out, err = _cli(capsys, "data", "verify", "--dir", tmp_path)
    assert code == 1 and f"{IDX_FILES[1]}: checksum mismatch" in out and "growmem data download" in err
    assert out.count(": ok") == 3


def test_every_missing_dataset_error_names_growmem_data_download(isolated):
    for name in data.names():
        with pytest.raises(DatasetNotFoundError, match=f"growmem data download {name}"):
            data.load(name, "test", download=False)
    with pytest.raises(DatasetNotFoundError, match="growmem data download mnist"):
        mnist.load("test")
    with pytest.raises(DatasetNotFoundError, match="growmem data download fashion_mnist"):
        data.verify("fashion_mnist")


def test_a_checksum_override_is_explicit_and_checked(isolated, tmp_path, monkeypatch):
    files, sums, _ = tiny_idx()
    (isolated / "mnist").mkdir(parents=True)
    for name, body in files.items():
        (isolated / "mnist" / name).write_bytes(body)
    with pytest.raises(CorruptDatasetError, match="sha256"):
        data.load("mnist", "test", download=False)                 # the pinned checksums refuse these files
    f = _override(tmp_path, monkeypatch, sums)
    assert data.load("mnist", "test", download=False)[0].shape == (5, 784)
    for bad, what in (({"nope.gz": "0" * 64}, "has no file"), ({IDX_FILES[0]: "xyz"}, "not an MD5 or SHA-256")):
        f.write_text(json.dumps({"mnist": bad}))
        with pytest.raises(data.DatasetError, match=what):
            data.load("mnist", "test", download=False)
    f.write_text("{")
    with pytest.raises(data.DatasetError, match="GROWMEM_DATA_CHECKSUMS.*cannot be read"):
        data.load("mnist", "test", download=False)
