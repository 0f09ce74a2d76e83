"""benchmarks/library_ab.py's problem names: a tuning-suite name resolves to that problem, an
ad-hoc shape `SPATIAL-kKERNEL-bB-hH-dD[-dilDIL]` builds one, anything else exits naming the
accepted forms."""

import importlib.util
import os
import random

import pytest

pytest.importorskip("triton")  # the script times with triton's do_bench

_PATH = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "library_ab.py")
_spec = importlib.util.spec_from_file_location("library_ab", _PATH)
library_ab = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(library_ab)


def test_suite_name_resolves():
    p = library_ab.problem("video-3d")
    assert p.name == "video-3d" and len(p.spatial) == 3


@pytest.mark.parametrize("na_dim", [1, 2, 3])
@pytest.mark.parametrize("dilated", [False, True])
def test_ad_hoc_shape(na_dim, dilated):
    rng = random.Random(na_dim * 2 + dilated)
    spatial = [rng.randint(8, 64) for _ in range(na_dim)]
    kernel = [rng.randrange(3, 8, 2) for _ in range(na_dim)]
    dilation = [rng.randint(2, 4) for _ in range(na_dim)] if dilated else [1] * na_dim
    b, h, d = rng.randint(1, 4), rng.randint(1, 12), rng.choice([32, 64, 128])
    x = "x".join
    name = f"{x(map(str, spatial))}-k{x(map(str, kernel))}-b{b}-h{h}-d{d}"
    if dilated:
        name += f"-dil{x(map(str, dilation))}"
    p = library_ab.problem(name)
    assert (p.spatial, p.kernel, p.dilation) == (tuple(spatial), tuple(kernel), tuple(dilation))
    assert (p.batch, p.heads, p.dim, p.dim_v, p.heads_kv) == (b, h, d, d, h)
    assert p.stride == (1,) * na_dim and p.causal == (False,) * na_dim


@pytest.mark.parametrize("name", ["no-such-problem", "16x16-k3-b1-h2", "16x16-k3x3-b1-h2-d64-dil"])
def test_unknown_names_exit_with_the_forms(name):
    with pytest.raises(SystemExit, match="SPATIAL-kKERNEL-bB-hH-dD"):
        library_ab.problem(name)
