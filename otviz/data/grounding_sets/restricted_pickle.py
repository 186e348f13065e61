"""Python pickles of plain data only: containers and scalars, never a class.

RefCOCO's ``refs(<split_by>).p`` is a pickle. Unpickling runs whatever callable the file
names (``os.system`` through a ``REDUCE``), so :func:`load_plain_pickle` uses an unpickler
that resolves no global at all: every opcode that needs one (``GLOBAL``, ``STACK_GLOBAL``,
``INST``, ``OBJ``, ``NEWOBJ``, ``REDUCE`` on a class, persistent ids) fails before anything
is called. What remains builds only dicts, lists, tuples, sets, strings, bytes, numbers,
booleans and ``None``.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

from otviz.data.datasets import MalformedDatasetError

MAX_PICKLE_BYTES = 2**30


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"names the class or function {module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("holds a persistent id")


def load_plain_pickle(data: bytes, shown: str) -> Any:
    """The plain data of pickle bytes ``data``; :class:`MalformedDatasetError` naming
    ``shown`` when it names any class or function, or does not unpickle. Python 2 strings
    are read as UTF-8 (undecodable bytes replaced)."""
    if len(data) > MAX_PICKLE_BYTES:
        raise MalformedDatasetError(f"{shown}: over {MAX_PICKLE_BYTES} bytes")
    try:
        return _PlainUnpickler(io.BytesIO(data), encoding="utf-8", errors="replace").load()
    except pickle.UnpicklingError as e:
        raise MalformedDatasetError(
            f"{shown}: refused: the pickle {e} (only plain containers and scalars are read)"
        ) from None
    except (EOFError, ValueError, TypeError, KeyError, IndexError, AttributeError,
            MemoryError, RecursionError, UnicodeDecodeError, OverflowError) as e:
        raise MalformedDatasetError(f"{shown}: not a readable pickle ({type(e).__name__})"
                                    ) from None
