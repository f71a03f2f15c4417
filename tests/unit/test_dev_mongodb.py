"""The set-up's mongod builds without a network: a pinned download is used only with its digest,
a build is named by the version its binary prints, and only mongod gets the extra libraries."""

from __future__ import annotations

import functools
import hashlib
import http.server
import os
import threading
from pathlib import Path

import pytest

from relay.dev import debian, mongodb
from relay.dev.digests import verify
from relay.dev.processes import DevStackError


def _package(data: bytes) -> debian.DebianPackage:
    return debian.DebianPackage("libexample1", "1.0-1", "amd64", "main/e/example", hashlib.sha256(data).hexdigest())


def _mirror(root: Path, package: debian.DebianPackage, data: bytes) -> str:
    path = root / "pool" / package.pool / package.filename
    path.parent.mkdir(parents=True)
    path.write_bytes(data)
    return root.as_uri()


def test_a_package_is_taken_from_a_mirror_when_its_digest_is_the_pinned_one(tmp_path):
    package = _package(b"a package")
    mirror = _mirror(tmp_path / "mirror", package, b"a package")
    deb = debian.download(package, tmp_path / "download", mirrors=(mirror,))
    assert deb.read_bytes() == b"a package"


def test_a_package_whose_digest_differs_is_deleted_and_refused_naming_both_digests(tmp_path):
    package = _package(b"what was pinned")
    mirror = _mirror(tmp_path / "mirror", package, b"something else")
    with pytest.raises(DevStackError) as raised:
        debian.download(package, tmp_path / "download", mirrors=(mirror,))
    message = str(raised.value)
    assert package.sha256 in message and hashlib.sha256(b"something else").hexdigest() in message
    assert package.filename in message
    assert not (tmp_path / "download" / package.filename).exists()


class _QuietFiles(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


def test_a_mirror_that_lacks_the_package_is_passed_over_for_the_next(tmp_path):
    package = _package(b"a package")
    _mirror(tmp_path / "b", package, b"a package")
    (tmp_path / "a").mkdir()
    handler = functools.partial(_QuietFiles, directory=str(tmp_path))
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            base = f"http://127.0.0.1:{server.server_address[1]}"
            deb = debian.download(package, tmp_path / "download", mirrors=(f"{base}/a", f"{base}/b"))
        finally:
            server.shutdown()
    assert deb.read_bytes() == b"a package"


def test_verify_passes_a_file_with_the_pinned_digest(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"x")
    assert verify(path, hashlib.sha256(b"x").hexdigest(), "f") == path


def test_the_pinned_libssl_is_bullseyes_openssl_1_1_in_its_pool_on_every_mirror():
    urls = debian.LIBSSL11.urls()
    assert urls[0] == ("https://deb.debian.org/debian/pool/main/o/openssl/libssl1.1_1.1.1w-0+deb11u1_amd64.deb")
    assert all(url.endswith("/pool/main/o/openssl/libssl1.1_1.1.1w-0+deb11u1_amd64.deb") for url in urls)


def _fake_mongod(tmp_path: Path, script: str) -> Path:
    path = tmp_path / "mongod"
    path.write_text(f"#!/bin/sh\n{script}\n")
    path.chmod(0o755)
    return path


def test_a_mongod_is_known_by_the_version_it_prints(tmp_path):
    path = _fake_mongod(tmp_path, 'echo "db version v6.0.27"; echo "Build Info: {}"')
    assert mongodb.Mongod(path).version() == "6.0.27"


def test_a_mongod_that_cannot_load_its_libraries_is_an_error_with_the_loaders_message(tmp_path):
    loader = "mongod: error while loading shared libraries: libcrypto.so.1.1: cannot open shared object file"
    path = _fake_mongod(tmp_path, f'echo "{loader}" >&2; exit 127')
    with pytest.raises(DevStackError, match="exited with 127: .*libcrypto.so.1.1"):
        mongodb.Mongod(path).version()


def test_only_mongod_gets_the_libraries_first_on_its_library_path(tmp_path, monkeypatch):
    monkeypatch.setenv("LD_LIBRARY_PATH", "/opt/other")
    path = _fake_mongod(tmp_path, 'echo "db version v0.0.0 $LD_LIBRARY_PATH"')
    with_libraries = mongodb.Mongod(path, tmp_path / "lib")
    assert with_libraries.environ()["LD_LIBRARY_PATH"] == f"{tmp_path / 'lib'}{os.pathsep}/opt/other"
    assert mongodb.Mongod(path).environ() is None, "a mongod that needs no library runs in the caller's environment"
    assert os.environ["LD_LIBRARY_PATH"] == "/opt/other", "this process's environment is left alone"


def test_each_build_is_pinned_and_only_6_0_27_needs_openssl_1_1():
    assert set(mongodb.BUILDS) == {mongodb.DEFAULT_VERSION, mongodb.OLDEST_VERSION} == {"6.0.27", "6.0.5"}
    for build in mongodb.BUILDS.values():
        assert len(build.sha256) == 64 and "==" in build.wheel
    assert mongodb.BUILDS["6.0.27"].libraries is debian.LIBSSL11
    assert mongodb.BUILDS["6.0.5"].libraries is None


def test_a_missing_build_is_not_fetched_when_fetching_is_off(tmp_path, monkeypatch):
    monkeypatch.setenv("RELAY_CACHE_DIR", str(tmp_path))
    with pytest.raises(DevStackError, match="mongod 6.0.27 not in .*run `python -m relay.dev.mongodb 6.0.27`"):
        mongodb.installed(fetch=False)


def test_an_unknown_version_names_the_known_ones():
    with pytest.raises(DevStackError, match="'7.0.1'.*6.0.27, 6.0.5"):
        mongodb.installed("7.0.1")
