"""The node images' names and content hashes: which files count, what changes a tag and what does not."""

from __future__ import annotations

import shutil
import tarfile
from pathlib import Path

import pytest

from corral.devcluster import images_debian
from corral.devcluster.imagehash import (
    HashInputs,
    corral_content_hash,
    corral_tag,
    dockerfile_copy_sources,
    image_ref,
    is_ignored,
)
from corral.devcluster.imagelayers import (
    CAP_NET_BIND_SERVICE,
    copied,
    directory,
    layer_hash,
    symlink,
    write_layer,
    written,
)
from corral.devcluster.images_corral import repository

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def context(tmp_path: Path) -> Path:
    """A copy of what the real Dockerfile reads, plus files it does not copy."""
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    for name in ("Dockerfile", ".dockerignore", "pyproject.toml", "README.md"):
        shutil.copy(REPO / name, ctx / name)
    (ctx / "controller" / "corral").mkdir(parents=True)
    (ctx / "controller" / "corral" / "__init__.py").write_text("VERSION = 1\n")
    for package in ("corral_fw", "corral_sim"):
        (ctx / "firmware" / package).mkdir(parents=True)
        (ctx / "firmware" / package / "__init__.py").write_text("")
    (ctx / "tests").mkdir()
    (ctx / "tests" / "test_x.py").write_text("def test(): pass\n")
    return ctx


def test_names_are_under_a_registry_nobody_serves_and_corral_tags_start_with_the_version() -> None:
    assert image_ref("coredns", "abc") == "corral.local/coredns:abc"
    assert corral_tag("0.2.0", "0123456789abcdef" * 4) == "0.2.0-0123456789ab"


def test_the_dockerfile_copies_what_the_repository_dockerfile_lists_and_not_the_stage_copy() -> None:
    sources = dockerfile_copy_sources((REPO / "Dockerfile").read_text())
    assert sources == ["pyproject.toml", "README.md", "controller", "firmware/corral_fw", "firmware/corral_sim"]
    text = "FROM x\nCOPY --chown=1:1 a \\\n  b /dst/\nCOPY --from=build /opt /opt\n# COPY c /d\nADD e /f\n"
    assert dockerfile_copy_sources(text) == ["a", "b", "e"]


def test_the_repository_dockerignore_keeps_caches_out_and_the_copied_trees_in() -> None:
    patterns = [p for p in (REPO / ".dockerignore").read_text().splitlines() if p and not p.startswith("#")]
    assert not is_ignored("controller/corral/cli/main.py", patterns)
    assert not is_ignored("pyproject.toml", patterns)
    assert is_ignored("controller/corral/__pycache__/x.cpython-311.pyc", patterns)
    assert is_ignored("controller/corral/stale.pyc", patterns)
    assert is_ignored("tests/unit/test_x.py", patterns)
    assert is_ignored("firmware/node_modules/a.js", patterns)


def test_a_copied_file_changes_the_corral_tag_and_an_uncopied_one_does_not(context: Path) -> None:
    before = corral_content_hash(context, "base1")
    (context / "tests" / "test_x.py").write_text("changed\n")
    (context / "controller" / "corral" / "__pycache__").mkdir()
    (context / "controller" / "corral" / "__pycache__" / "m.pyc").write_bytes(b"\0")
    assert corral_content_hash(context, "base1") == before
    (context / "controller" / "corral" / "__init__.py").write_text("VERSION = 2\n")
    assert corral_content_hash(context, "base1") != before


@pytest.mark.parametrize("change", ["Dockerfile", "base", "new file", "mode"])
def test_the_dockerfile_the_base_a_new_copied_file_and_an_executable_bit_change_the_corral_tag(
    context: Path, change: str
) -> None:
    before = corral_content_hash(context, "base1")
    base = "base1"
    if change == "Dockerfile":
        with (context / "Dockerfile").open("a") as f:
            f.write("LABEL x=y\n")
    elif change == "base":
        base = "base2"
    elif change == "new file":
        (context / "firmware" / "corral_sim" / "extra.py").write_text("")
    else:
        (context / "controller" / "corral" / "__init__.py").chmod(0o755)
    assert corral_content_hash(context, base) != before


def test_a_file_the_dockerfile_copies_but_the_context_lacks_is_named(context: Path) -> None:
    shutil.rmtree(context / "firmware" / "corral_sim")
    with pytest.raises(FileNotFoundError, match="firmware/corral_sim"):
        corral_content_hash(context, "base1")


def test_the_repository_itself_hashes_and_is_where_the_dockerfile_is() -> None:
    assert (repository() / "Dockerfile").is_file()
    assert len(corral_content_hash(repository(), "b")) == 64


def test_debian_tags_follow_the_recipe_and_the_apt_sources(tmp_path: Path) -> None:
    sources = tmp_path / "debian.sources"
    sources.write_text("Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm\n")
    python = images_debian.tag(images_debian.PYTHON, sources)
    assert python == images_debian.tag(images_debian.PYTHON, sources)
    assert images_debian.tag(images_debian.MOSQUITTO, sources) != python
    sources.write_text("Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm\n")
    assert images_debian.tag(images_debian.PYTHON, sources) != python


def test_the_broker_recipe_is_laid_out_as_the_chart_expects_of_eclipse_mosquitto() -> None:
    chart_values = (REPO / "charts" / "corral" / "values.yaml").read_text()
    added = {e.path: e for e in images_debian.MOSQUITTO.added}
    plugin = added["usr/lib/mosquitto_dynamic_security.so"]
    assert f"dynsecPlugin: /{plugin.path}" in chart_values
    assert plugin.kind == "symlink" and plugin.target and plugin.target.endswith("/mosquitto_dynamic_security.so")
    for path in ("mosquitto/config", "mosquitto/data", "mosquitto/log"):
        assert (added[path].uid, added[path].gid) == (1883, 1883)
    assert images_debian.MOSQUITTO.config.cmd == ("/usr/sbin/mosquitto", "-c", "/mosquitto/config/mosquitto.conf")


def test_a_layer_is_the_same_bytes_every_time_with_owners_modes_and_parents(tmp_path: Path) -> None:
    binary = tmp_path / "tool"
    binary.write_bytes(b"\x7fELF")
    entries = [copied("usr/bin/tool", binary), symlink("bin/t", "/usr/bin/tool"), written("etc/x.conf", "a=1\n"),
               directory("data", 0o700, 1883, 1883)]
    first, second = write_layer(entries, tmp_path / "a.tar"), write_layer(entries, tmp_path / "b.tar")
    assert first.read_bytes() == second.read_bytes()
    with tarfile.open(first) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert {"usr", "usr/bin", "bin", "etc"} <= set(members)
    assert members["usr/bin/tool"].mode == 0o755 and members["etc/x.conf"].mode == 0o644
    assert members["bin/t"].issym() and members["bin/t"].linkname == "/usr/bin/tool"
    assert (members["data"].uid, members["data"].mode) == (1883, 0o700)


def test_a_file_capability_is_written_as_setcap_would_and_changes_the_layer_hash(tmp_path: Path) -> None:
    binary = tmp_path / "coredns"
    binary.write_bytes(b"\x7fELF")
    plain, capable = copied("coredns", binary), copied("coredns", binary, capabilities=(CAP_NET_BIND_SERVICE,))
    with tarfile.open(write_layer([capable], tmp_path / "l.tar"), encoding="utf-8", errors="surrogateescape") as tar:
        value = tar.getmember("coredns").pax_headers["SCHILY.xattr.security.capability"]
    # `getcap` reads it as cap_net_bind_service=ep: revision 2, effective, bit 10 permitted.
    assert value.encode("utf-8", "surrogateescape") == bytes.fromhex("01000002" "00040000" "00000000" "00000000" "00000000")
    hashes = {layer_hash(HashInputs("x"), "l", [entry]).hexdigest() for entry in (plain, capable)}
    assert len(hashes) == 2
