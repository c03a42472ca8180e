"""``client.upload_file``: a file every worker process can import from (no I/O to peers).

Files go to one directory per worker process, first on ``sys.path``: a ``.py`` file is a
module (re-imported if it was imported already), a ``.zip``/``.egg``/``.whl`` goes on
``sys.path`` itself. Installed in the scheduler connection's order, before any task sent
after it, so the tasks after an upload always see it.
"""

from __future__ import annotations

import importlib
import os
import sys
import tempfile
from typing import Any

from apportion.serialize import dumps_exception, dumps_value

_directory: str | None = None


def upload_directory() -> str:
    global _directory
    if _directory is None:
        _directory = tempfile.mkdtemp(prefix="apportion-uploads-")
        sys.path.insert(0, _directory)
    return _directory


def install(filename: str, data: bytes) -> str:
    """Write the file and make it importable; returns where it was written."""
    name = os.path.basename(filename)
    if not name or name != filename:
        raise ValueError(f"upload a file by its bare name, got {filename!r}")
    path = os.path.join(upload_directory(), name)
    with open(path, "wb") as f:
        f.write(data)
    root, ext = os.path.splitext(name)
    if ext in (".zip", ".egg", ".whl") and path not in sys.path:
        sys.path.insert(0, path)
    importlib.invalidate_caches()
    if ext == ".py" and root in sys.modules:
        importlib.reload(sys.modules[root])
    return path


def reply_to(message: dict[str, Any]) -> dict[str, Any]:
    """Install an ``upload-file`` message; the answer the scheduler tallies."""
    result: dict[str, Any]
    try:
        result = {"result": dumps_value(install(message["filename"], message["data"]))}
    except Exception as exc:
        data, text = dumps_exception(exc)
        result = {"exception": data, "traceback": text}
    return {"op": "run-result", "id": message["id"], **result}
