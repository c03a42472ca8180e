"""The two Dask functions apportion wraps: still shaped as written for, still needed.

A failure here means the installed Dask changed: either a wrapped function no longer has
the shape its wrapper relies on (the wrapper is then left out, with a warning), or Dask
now does by itself what a wrapper was for (then drop that wrapper).
"""

from __future__ import annotations

from collections.abc import Iterator

import dask
import dask.dataframe as dd
import pandas as pd
import pytest
from dask.highlevelgraph import HighLevelGraph
from dask.tokenize import tokenize

from apportion import dask_patches, dask_regions
from apportion.dask_graph import install


@pytest.fixture
def plain_dask() -> Iterator[None]:
    """Dask without apportion's wrappers, for the length of a test."""
    dask_patches.uninstall()
    try:
        yield
    finally:
        install()


def double(x: int) -> int:
    return x * 2


def test_the_wrapped_functions_still_have_the_shape_the_wrappers_rely_on() -> None:
    assert dask_patches.problems() == {}


def test_dask_still_gives_culled_layers_the_annotations_of_the_block_it_culls_in(
    plain_dask: None,
) -> None:
    graph = HighLevelGraph.from_collections("outside-" + tokenize(1), {"a": 1, "b": 2}, ())
    with dask.annotate(resources={"GPU": 1}):
        culled = graph.cull({"a"})
    (layer,) = culled.layers.values()
    # Fixed in Dask (None here)? Then drop dask_patches._cull_outside_annotations.
    assert layer.annotations == {"resources": {"GPU": 1}}


def test_culling_keeps_what_a_layer_was_written_with() -> None:
    install()
    graph = HighLevelGraph.from_collections("outside-" + tokenize(2), {"a": 1, "b": 2}, ())
    with dask.annotate(resources={"GPU": 1}):
        culled = graph.cull({"a"})
    (layer,) = culled.layers.values()
    assert layer.annotations is None


def test_dask_still_drops_the_annotations_of_dataframe_steps(plain_dask: None) -> None:
    x = dd.from_pandas(pd.DataFrame({"a": range(8)}), npartitions=2)
    with pytest.warns(UserWarning, match="Annotations will be ignored"):
        from dask.dataframe.dask_expr import _collection

        _collection._WARN_ANNOTATIONS = True
        with dask.annotate(resources={"GPU": 1}):
            y = x.map_partitions(double)
    # Kept by Dask (annotations on the expression)? Then bracketing is no longer needed.
    assert y.expr.__dask_annotations__() == {}
    assert not isinstance(y.expr, dask_regions.AnnotationBoundary)


def test_every_dataframe_collection_created_under_annotations_is_bracketed() -> None:
    install()
    x = dd.from_pandas(pd.DataFrame({"a": range(8), "b": range(8)}), npartitions=2)
    with dask.annotate(resources={"GPU": 1}):
        made = [
            x.map_partitions(double),
            x.a + 1,
            x[x.a > 2],
            x.groupby("a").b.sum(),
            x.b.sum(),
            x.merge(x, on="a"),
        ]
    for collection in made:
        assert isinstance(collection.expr, dask_regions.AnnotationBoundary), collection.expr
        assert collection.expr.operand("side") == "exit"


def test_a_dask_whose_functions_changed_gets_a_warning_and_no_wrapper(
    plain_dask: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dask_patches, "CULL_PARAMETERS", ["self", "keys", "renamed"])
    with pytest.warns(dask_patches.DaskCompatibilityWarning, match="HighLevelGraph.cull takes"):
        dask_patches.install()
    assert not hasattr(HighLevelGraph.cull, "__apportion_wraps__")
