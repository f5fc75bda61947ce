"""An opened dataset: its descriptor, file system, root path, live files and stored mixes.

    ds = open_dataset("s3://bucket/ds")         # descriptor, file system, root path
    for f in ds.shard_files("tokens"):          # the live view: part/shard=k/run_id, path
        ...

Opening a location is ``schemas.files``'s; which files are committed and live is
``schemas.manifest``'s; the mixes (``_mixes.json``) are read and written here.

Paths inside: everything below takes and returns paths of ``fs`` (no protocol); URIs
appear only where a caller outside hands them in or needs them out (``Dataset.uri_of``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from elmo_model.errors import ElmoUserError
from schemas.files import is_local, open_fs, read_json, write_bytes_atomic
from schemas.layout import DESCRIPTOR_FILE
from schemas.manifest import ShardFile, list_files
from schemas.mix_specs import (
    MIXES_FILE,
    Mix,
    check_name,
    mixes_file_bytes,
    parse_mixes_file,
    resolve_mix,
)
from schemas.tables import DatasetDescriptor


@dataclass
class Dataset:
    """A readable dataset: descriptor, file system, root path and its live files."""

    uri: str
    descriptor: DatasetDescriptor
    fs: Any
    root: str
    storage_options: dict | None = None

    def shard_files(self, table: str = "tokens", parts: Iterable[str] | None = None
                    ) -> list[ShardFile]:
        """``list_files`` of this dataset: ``(key, path)`` per file."""
        return list_files(self.fs, self.root, table, parts)

    def paths(self, table: str = "tokens") -> list[str]:
        """Paths (for ``fs``) of the live files of one table."""
        return [f.path for f in self.shard_files(table)]

    @property
    def is_local(self) -> bool:
        return is_local(self.fs)

    def uri_of(self, path: str) -> str:
        """The URI of one of this dataset's paths, for readers outside fsspec."""
        return self.fs.unstrip_protocol(path)

    def arrow_filesystem(self) -> Any:
        import pyarrow.fs as pafs

        if self.is_local:
            return pafs.LocalFileSystem()
        return pafs.PyFileSystem(pafs.FSSpecHandler(self.fs))

    def mixes(self) -> dict[str, Mix]:
        """The mixes stored with the dataset (built-ins are not stored)."""
        data = read_json(self.fs, f"{self.root}/{MIXES_FILE}")
        return {} if data is None else parse_mixes_file(data, f"{self.uri}/{MIXES_FILE}")

    def mix(self, spec: str | Mapping[str, Any] | Mix) -> Mix:
        if self.descriptor.n_output_layers < 1:
            raise ElmoUserError(f"{self.uri} stores no layers to mix")
        return resolve_mix(spec, self.descriptor.n_output_layers, self.mixes())

    def save_mix(self, mix: Mix) -> None:
        """Add or replace one named mix in ``_mixes.json`` (read-modify-write, atomic
        move; writers of mixes take no lock: last writer wins)."""
        check_name(mix.name)
        if mix.n_layers != self.descriptor.n_output_layers:
            raise ElmoUserError(f"mix {mix.name!r} has {mix.n_layers} weights; the dataset "
                                f"has {self.descriptor.n_output_layers} layers")
        mixes = self.mixes()
        mixes[mix.name] = mix
        write_bytes_atomic(self.fs, f"{self.root}/{MIXES_FILE}", mixes_file_bytes(mixes))


def _descriptor(fs: Any, root: str, uri: str) -> DatasetDescriptor:
    data = read_json(fs, f"{root}/{DESCRIPTOR_FILE}")
    if data is None:
        raise ElmoUserError(f"{uri} is not an elmo-store dataset (no {DESCRIPTOR_FILE})")
    try:
        return DatasetDescriptor.from_json(json.dumps(data))
    except (ValueError, TypeError) as error:
        raise ElmoUserError(f"{uri}: unreadable dataset descriptor ({error})") from None


def read_dataset_descriptor(uri: str, storage_options: dict | None = None
                            ) -> DatasetDescriptor:
    return _descriptor(*open_fs(uri, storage_options), str(uri))


def open_dataset(uri: str, storage_options: dict | None = None) -> Dataset:
    fs, root = open_fs(uri, storage_options)
    return Dataset(str(uri), _descriptor(fs, root, str(uri)), fs, root, storage_options)


def load_mixes(dataset: str, storage_options: dict | None = None) -> dict[str, Mix]:
    """The mixes stored in a dataset (built-ins are not stored)."""
    return open_dataset(dataset, storage_options).mixes()


def save_mix(dataset: str, mix: Mix, storage_options: dict | None = None) -> None:
    open_dataset(dataset, storage_options).save_mix(mix)
