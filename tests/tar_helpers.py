"""Small gzip tarballs built in memory for tests: members given as name -> bytes (or text), one
regular file each, in the given order, with nothing normalised or checked (a test may want a
tarball the project would refuse)."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Mapping


def tar_gz(members: Mapping[str, str | bytes]) -> bytes:
    """The ``.tar.gz`` bytes of ``members`` (text is encoded as UTF-8)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, data in members.items():
            raw = data.encode() if isinstance(data, str) else data
            info = tarfile.TarInfo(name)
            info.size = len(raw)
            archive.addfile(info, io.BytesIO(raw))
    return buffer.getvalue()
