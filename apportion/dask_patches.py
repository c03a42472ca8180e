"""The two places where apportion changes what Dask does, each narrow and checked.

Dask offers no extension point for either (an annotate block runs no hook; a dataframe
collection is created by its class alone, and ``get_collection_type`` would replace
Dask's own classes for every pandas type; culling has no option), so each wraps one
function, and only while that function still has the shape it was written against:

- ``dask.dataframe``'s ``FrameBase.__init__(self, expr)``, through which every dataframe
  collection is created: under annotations, the new expression is bracketed
  (``apportion.dask_regions``). Dask itself drops these annotations, with a warning.
- ``HighLevelGraph.cull(self, keys)``: Dask gives the layers it culls into the
  annotations of the block it culls in (``Layer.__init__`` falls back to
  ``dask.get_annotations()``), so a ``delayed`` call inside a block gave its arguments,
  built outside, the block's demand. Culling runs outside any block instead.

Where Dask has changed a target (``problems``), its wrapper is not installed and a
``DaskCompatibilityWarning`` says what no longer holds and what is lost;
``tests/unit/test_dask_patches.py`` fails on such a Dask, and also once Dask no longer
needs a wrapper (its behaviour fixed), so each is dropped when it stops being needed.
"""

from __future__ import annotations

import contextvars
import inspect
import sys
import warnings
from collections.abc import Callable
from typing import Any

import dask

from apportion.import_hooks import after_import

# The parameters each wrapped function had when its wrapper was written.
FRAME_INIT_PARAMETERS = ["self", "expr"]
CULL_PARAMETERS = ["self", "keys"]


class DaskCompatibilityWarning(UserWarning):
    """This Dask differs from the one apportion's Dask integration was written for."""


def _parameters(func: Callable[..., Any]) -> list[str]:
    return list(inspect.signature(func).parameters)


def _original(func: Any) -> Any:
    return getattr(func, "__apportion_wraps__", func)


def problems() -> dict[str, str]:
    """What no longer holds in the installed Dask, per wrapper ("cull", "dataframes"),
    in a sentence (empty: all is well)."""
    found = {}
    from dask import base
    from dask.highlevelgraph import HighLevelGraph

    cull = _parameters(_original(HighLevelGraph.cull))
    if not isinstance(getattr(base, "_annotations", None), contextvars.ContextVar):
        found["cull"] = "dask.base._annotations is no longer the annotate blocks' ContextVar"
    elif cull != CULL_PARAMETERS:
        found["cull"] = f"HighLevelGraph.cull takes {cull}, not {CULL_PARAMETERS}"
    if "dask.dataframe" in sys.modules:
        try:
            from dask.dataframe.dask_expr import _collection
        except ImportError:
            found["dataframes"] = "dask.dataframe.dask_expr._collection is gone"
        else:
            init = _parameters(_original(_collection.FrameBase.__init__))
            if init != FRAME_INIT_PARAMETERS:
                found["dataframes"] = (
                    f"dask.dataframe's FrameBase.__init__ takes {init}, not {FRAME_INIT_PARAMETERS}"
                )
    return found


def install() -> None:
    """Wrap what still has its expected shape; warn once about the rest. Idempotent."""
    found = problems()
    if found:
        warnings.warn(
            f"this Dask ({dask.__version__}) differs from the one apportion was written for: "
            f"{'; '.join(found.values())}. Annotations on dataframes, or on delayed calls built in "
            "one annotate block from objects built outside it, may not reach their tasks; "
            "install the Dask version apportion's 'dask' extra names",
            DaskCompatibilityWarning,
            stacklevel=3,
        )
    if "cull" not in found:
        _cull_outside_annotations()
    if "dask.dataframe" not in sys.modules:
        # Imported later (after the client exists, say): wrapped as soon as it is, so that
        # its collections keep their annotations whatever the order of the imports.
        after_import("dask.dataframe", install)
    elif "dataframes" not in found:
        _bracket_annotated_dataframes()


def _cull_outside_annotations() -> None:
    from dask import base
    from dask.highlevelgraph import HighLevelGraph

    original = HighLevelGraph.cull
    if hasattr(original, "__apportion_wraps__"):
        return

    def cull(self: Any, keys: Any) -> Any:
        token = base._annotations.set(None)
        try:
            return original(self, keys)
        finally:
            base._annotations.reset(token)

    cull.__apportion_wraps__ = original  # type: ignore[attr-defined]
    HighLevelGraph.cull = cull  # type: ignore[method-assign]


def _bracket_annotated_dataframes() -> None:
    from dask.dataframe.dask_expr import _collection

    from apportion import dask_regions
    from apportion.annotations import current

    original = _collection.FrameBase.__init__
    if hasattr(original, "__apportion_wraps__"):
        return

    def __init__(self: Any, expr: Any) -> None:
        annotations = {**dask.get_annotations(), **current()}
        if annotations:
            expr = dask_regions.bracket(expr, annotations)
        dask_regions.remember(expr)
        original(self, expr)

    __init__.__apportion_wraps__ = original  # type: ignore[attr-defined]
    _collection.FrameBase.__init__ = __init__  # type: ignore[method-assign]
    # Its "annotations will be ignored" warning no longer holds.
    _collection._WARN_ANNOTATIONS = False


def uninstall() -> None:
    """Dask as it was (for tests that check Dask's own behaviour)."""
    from dask.highlevelgraph import HighLevelGraph

    HighLevelGraph.cull = _original(HighLevelGraph.cull)  # type: ignore[method-assign]
    if "dask.dataframe" in sys.modules:
        from dask.dataframe.dask_expr import _collection

        _collection.FrameBase.__init__ = _original(  # type: ignore[method-assign]
            _collection.FrameBase.__init__
        )
