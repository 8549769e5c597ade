"""File modes under a umask: what the tests of the commands' outputs set and read (a written
file must have the mode a plain open() gives: 0666 less the umask; a folder 0777 less it)."""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterable, Iterator


@contextlib.contextmanager
def umask(mask: int) -> Iterator[None]:
    """The process's umask set to `mask` for the block (then put back)."""
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def modes(root: str | os.PathLike, names: Iterable[str]) -> dict[str, int]:
    """Permission bits of root/name for each name."""
    return {n: stat.S_IMODE(os.stat(os.path.join(root, n)).st_mode) for n in names}
