"""Every bad input raises a clear error that names the argument."""

import pytest
import torch

import nattn


def qkv(shape=(1, 8, 9, 2, 4), heads_kv=None, dim_v=None, dtype=torch.float32):
    b, x, y, h, d = shape
    hk = heads_kv or h
    return (
        torch.randn(b, x, y, h, d, dtype=dtype),
        torch.randn(b, x, y, hk, d, dtype=dtype),
        torch.randn(b, x, y, hk, dim_v or d, dtype=dtype),
    )


def call(**overrides):
    q, k, v = qkv()
    args = dict(query=q, key=k, value=v, kernel_size=3)
    args.update(overrides)
    return nattn.na2d(**args)


Q, K, V = qkv()
BAD = [
    # (overrides, exception, words the message must contain)
    (dict(query=Q[0]), ValueError, ["query", "rank 5"]),
    (dict(key=K[..., :3]), ValueError, ["key head dim"]),
    (dict(value=V[:, :4]), ValueError, ["key and value"]),
    (dict(key=K[:, :4], value=V[:, :4]), ValueError, ["query and key"]),
    (dict(key=K.double()), TypeError, ["key dtype"]),
    (dict(query=Q.int()), TypeError, ["query", "float32"]),
    (dict(query=[1, 2]), TypeError, ["query", "torch.Tensor"]),
    (dict(query=torch.randn(1, 8, 9, 3, 4)), ValueError, ["divisible"]),
    (dict(kernel_size=1), ValueError, ["kernel_size", "axis 0", ">= 2"]),
    (dict(kernel_size=(3, 10)), ValueError, ["kernel_size * dilation", "axis 1", "9"]),
    (dict(kernel_size=3, dilation=(2, 4)), ValueError, ["kernel_size * dilation", "axis 1"]),
    (dict(dilation=0), ValueError, ["dilation", ">= 1"]),
    (dict(stride=4), ValueError, ["stride", "<= kernel_size"]),
    (dict(stride=0), ValueError, ["stride"]),
    (dict(kernel_size=3.0), TypeError, ["kernel_size", "int"]),
    (dict(kernel_size=(3, "3")), TypeError, ["kernel_size", "axis 1"]),
    (dict(kernel_size=(3, 3, 3)), ValueError, ["kernel_size", "tuple of 2"]),
    (dict(stride=(1,)), ValueError, ["stride", "tuple of 2"]),
    (dict(is_causal=(True,)), ValueError, ["is_causal", "tuple of 2"]),
    (dict(is_causal=1), TypeError, ["is_causal", "bool"]),
    (dict(scale="big"), TypeError, ["scale", "finite real number"]),
    (dict(scale=[0.3]), TypeError, ["scale", "finite real number", "list"]),
    (dict(scale=True), TypeError, ["scale", "bool"]),
    (dict(scale=torch.tensor(0.3)), TypeError, ["scale", "Tensor"]),
    (dict(scale=float("nan")), ValueError, ["scale", "finite real number", "nan"]),
    (dict(scale=float("-inf")), ValueError, ["scale", "-inf"]),
    (dict(scale=10**400), ValueError, ["scale", "finite real number", "..."]),
    (dict(kernel_size=4, rpb=torch.zeros(2, 7, 7)), ValueError, ["rpb", "odd kernel_size"]),
    (dict(stride=2, rpb=torch.zeros(2, 5, 5)), ValueError, ["rpb", "stride 1"]),
    (dict(is_causal=(False, True), rpb=torch.zeros(2, 5, 5)), ValueError, ["rpb", "is_causal=False"]),
    (dict(rpb=torch.zeros(2, 5, 4)), ValueError, ["rpb", "(2, 5, 5)"]),
    (dict(rpb=torch.zeros(3, 5, 5)), ValueError, ["rpb", "shape"]),
    (dict(additional_keys=torch.zeros(1, 3, 2, 4)), ValueError, ["together"]),
    (dict(additional_keys=torch.zeros(1, 3, 2, 5), additional_values=torch.zeros(1, 3, 2, 4)),
     ValueError, ["additional_keys", "shape"]),
    (dict(additional_keys=torch.zeros(1, 3, 2, 4), additional_values=torch.zeros(1, 2, 2, 4)),
     ValueError, ["N_extra"]),
    (dict(additional_keys=torch.zeros(2, 3, 2, 4), additional_values=torch.zeros(2, 3, 2, 4)),
     ValueError, ["additional_keys", "B=1"]),
    (dict(query=torch.zeros(0, 8, 9, 2, 4), key=torch.zeros(0, 8, 9, 2, 4), value=torch.zeros(0, 8, 9, 2, 4)),
     ValueError, ["query", "empty"]),
    (dict(key=K.to("meta"), value=V.to("meta")), ValueError, ["key device", "meta"]),
    (dict(rpb=torch.zeros(2, 5, 5, device="meta")), ValueError, ["rpb device"]),
    (dict(backend="tpu"), ValueError, ["backend", "reference"]),
]


@pytest.mark.parametrize("overrides,exc,words", BAD, ids=lambda x: str(x)[:60] if isinstance(x, dict) else None)
def test_bad_input_raises_clear_error(overrides, exc, words):
    with pytest.raises(exc) as info:
        call(**overrides)
    for word in words:
        assert word in str(info.value), f"{word!r} not in {str(info.value)!r}"


@pytest.mark.parametrize("na_dim", [1, 2, 3])
def test_heads_first_input_error_shows_the_expected_layout(na_dim):
    """A heads-first [B, H, *spatial, D] tensor fails on the kernel-vs-axis check (here the
    heads axis, read as X, is shorter than the kernel); the error shows the heads-last layout
    and the sizes it read, and how to convert."""
    spatial = tuple(int(n) for n in torch.randint(8, 12, (na_dim,)))
    heads = int(torch.randint(2, 4, ()))
    q = torch.randn(2, heads, *spatial, 4)  # heads first: wrong
    fn = {1: nattn.na1d, 2: nattn.na2d, 3: nattn.na3d}[na_dim]
    with pytest.raises(ValueError) as info:
        fn(q, q, q, kernel_size=5)
    msg = str(info.value)
    axes = ", ".join("XYZ"[:na_dim])
    for word in [f"[B, {axes}, H, D]", f"X={heads}", f"H={spatial[-1]}", "heads-first", ".movedim(1, -2)"]:
        assert word in msg, f"{word!r} not in {msg!r}"
    with pytest.raises(ValueError, match=r"heads-last \[B, X, H, D\]"):  # GQA heads-first: spatial mismatch
        nattn.na1d(torch.randn(1, 4, 16, 8), torch.randn(1, 2, 16, 8), torch.randn(1, 2, 16, 8), 3)


def test_axis_shorter_than_kernel_raises():
    q = torch.randn(1, 5, 2, 4)
    with pytest.raises(ValueError, match=r"axis 0 \(X\).*6 \* 1 = 6"):
        nattn.na1d(q, q, q, kernel_size=6)


def test_attention_errors():
    q = torch.randn(1, 6, 2, 4)
    with pytest.raises(ValueError, match="rank 4"):
        nattn.attention(q[0], q[0], q[0])
    with pytest.raises(ValueError, match="as many keys as queries"):
        nattn.attention(q, q[:, :3], q[:, :3], is_causal=True)
    with pytest.raises(ValueError, match="merge_attentions"):
        nattn.merge_attentions([q], [q[..., 0]])
    with pytest.raises(ValueError, match=r"lse_tensors\[1\]"):
        nattn.merge_attentions([q, q], [q[..., 0], q])


SCALE_BAD = [("a", TypeError), ([0.3], TypeError), (True, TypeError), (float("nan"), ValueError),
             (float("inf"), ValueError), (10**400, ValueError)]


@pytest.mark.parametrize("scale,exc", SCALE_BAD, ids=lambda x: repr(x)[:12])
def test_dense_attention_validates_scale_like_na(scale, exc):
    q = torch.randn(1, 6, 2, 4)
    with pytest.raises(exc, match="scale must be a finite real number"):
        nattn.attention(q, q, q, scale=scale)


@pytest.mark.parametrize("scale", [0, -0.7, 2, 0.25])
def test_zero_negative_and_int_scales_are_accepted(scale):
    """Any finite real scale is accepted (as in NATTEN); 0 gives uniform weights."""
    q, k, v = (torch.randn(1, 7, 2, 4, dtype=torch.float64) for _ in range(3))
    out = nattn.na1d(q, k, v, kernel_size=7, scale=scale)
    want = nattn.attention(q, k, v, scale=float(scale))
    torch.testing.assert_close(out, want)
    if scale == 0:
        torch.testing.assert_close(out, v.mean(1, keepdim=True).expand_as(out))
