"""torch.compile(fullgraph=True) over a module calling na2d: no graph breaks, same numbers."""

import torch

import nattn


class TinyNA(torch.nn.Module):
    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.rpb = torch.nn.Parameter(torch.randn(heads, 5, 5) * 0.02)

    def forward(self, x):
        b, h, w, c = x.shape
        q, k, v = self.qkv(x).reshape(b, h, w, 3, self.heads, c // self.heads).unbind(3)
        out = nattn.na2d(q, k, v, kernel_size=3, dilation=(1, 2), rpb=self.rpb)
        extra = nattn.na2d(q, k, v, kernel_size=(2, 4), is_causal=(True, False),
                           additional_keys=k[:, 0], additional_values=v[:, 0])
        return (out + extra).reshape(b, h, w, c)


def test_compile_fullgraph_forward_backward():
    torch.manual_seed(0)
    model = TinyNA()
    x = torch.randn(2, 6, 7, 16)
    eager = model(x)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    out = compiled(x)
    torch.testing.assert_close(out, eager)
    out.sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    eager.sum().backward()
    for n, p in model.named_parameters():
        assert torch.isfinite(grads[n]).all()
        torch.testing.assert_close(grads[n], p.grad, msg=n)


def test_opcheck_custom_ops():
    q = torch.randn(1, 6, 5, 2, 4, requires_grad=True)
    k = torch.randn(1, 6, 5, 1, 4, requires_grad=True)
    v = torch.randn(1, 6, 5, 1, 3, requires_grad=True)
    rpb = torch.randn(2, 5, 5, requires_grad=True)
    op = torch.ops.nattn.na_forward.default
    torch.library.opcheck(op, (q, k, v, None, [3, 2], [1, 2], [1, 2], [True, False], 0.5, "reference"))
    torch.library.opcheck(op, (q, k, v, rpb, [3, 3], [1, 1], [1, 1], [False, False], 0.5, "reference"))
    qd = q.reshape(1, 30, 2, 4).detach().requires_grad_()
    kd = k.reshape(1, 30, 1, 4).detach().requires_grad_()
    vd = v.reshape(1, 30, 1, 3).detach().requires_grad_()
    torch.library.opcheck(torch.ops.nattn.attention_forward.default, (qd, kd, vd, True, 0.3, "reference"))


def test_a_compiled_call_defers_the_same_choice_to_its_op():
    """Under torch.compile the op gets a deferred backend string; resolved on the real
    tensors (autograd below the op: the string says whether gradients are needed) it names
    what the eager dispatch names."""
    from nattn.backends import choose_na_backend, deferred, heuristics
    from nattn.params import normalize

    q, k, v = (torch.randn(1, 6, 6, 2, 8, requires_grad=True) for _ in range(3))
    params = normalize(q, k, v, 2, 3, 1, 1, False, None, None, None, None)
    for requested, tune, det in [(None, None, None), ("reference", False, True), ("auto", True, False)]:
        name = deferred.spec(requested, tune, det, True)
        assert deferred.is_deferred(name) and not deferred.is_deferred("reference")
        want = choose_na_backend(q, k, v, None, params, requested, tune, det)
        assert deferred.resolve_na(name, q.detach(), k.detach(), v.detach(), None, params) == want
    assert deferred.resolve_na("reference", q, k, v, None, params) == "reference"
    with torch.no_grad():
        assert not heuristics.needs_grads(q)
        with heuristics.grads_hint(True):
            assert heuristics.needs_grads(q.detach())
    with heuristics.grads_hint(False):
        assert not heuristics.needs_grads(q)


def _graph_capture():
    """``(backend, graphs)``: a torch.compile backend (AOTAutograd, run as traced) that keeps
    the ops its forward and backward graphs call in ``graphs["fw"]`` / ``graphs["bw"]``."""
    from torch._functorch.aot_autograd import aot_module_simplified

    graphs = {}

    def keep(kind):
        def compiler(g, _):
            graphs[kind] = [str(n.target) for n in g.graph.nodes if n.op == "call_function"]
            return g.forward
        return compiler

    def capture(gm, inputs):
        return aot_module_simplified(gm, inputs, fw_compiler=keep("fw"), bw_compiler=keep("bw"))

    return capture, graphs


def test_compiled_backward_graph_has_no_zeros_for_an_unused_lse():
    """The op's autograd leaves an unused LSE's gradient None (the backends skip its term):
    a compiled backward graph holds the NA backward op and no zeros / fill kernel per call,
    and the gradients equal eager ones (fresh inputs)."""
    capture, graphs = _graph_capture()

    q, k, v = (torch.randn(1, 7, 9, 2, 16, requires_grad=True) for _ in range(3))
    rpb = torch.randn(2, 5, 5, requires_grad=True)
    f = torch.compile(lambda q, k, v, rpb: nattn.na2d(q, k, v, 3, rpb=rpb, backend="reference"),
                      backend=capture, fullgraph=True)
    g = torch.randn(1, 7, 9, 2, 16)
    f(q, k, v, rpb).backward(g)
    got = [t.grad for t in (q, k, v, rpb)]
    assert "nattn.na_backward.default" in graphs["bw"]
    assert not [op for op in graphs["bw"] if "zeros" in op or "full" in op or "fill" in op], graphs["bw"]
    for t in (q, k, v, rpb):
        t.grad = None
    nattn.na2d(q, k, v, 3, rpb=rpb, backend="reference").backward(g)
    for a, t in zip(got, (q, k, v, rpb)):
        torch.testing.assert_close(a, t.grad)


def test_opcheck_packed_qkv_ops():
    qkv = torch.randn(2, 5, 6, 3, 2, 8, requires_grad=True)
    rpb = torch.randn(2, 5, 5, requires_grad=True)
    op = torch.ops.nattn.na_qkv_forward.default
    torch.library.opcheck(op, (qkv, None, [3, 2], [1, 2], [1, 2], [True, False], 0.5, "reference"))
    torch.library.opcheck(op, (qkv, rpb, [3, 3], [1, 1], [1, 1], [False, False], 0.5, "reference"))


def test_compiled_module_trains_on_the_packed_qkv_op():
    """A compiled NA module calls the packed op: its backward graph returns d(qkv) from the
    NA backward op, no stack / cat of dq, dk, dv; values and gradients equal eager ones."""
    from nattn.nn import NeighborhoodAttention2D

    capture, graphs = _graph_capture()

    torch.manual_seed(torch.seed() % 2**31)
    layer = NeighborhoodAttention2D(16, 2, kernel_size=3, dilation=(1, 2), rel_pos_bias=True, backend="reference")
    x = torch.randn(2, 6, 9, 16)
    g = torch.randn(2, 6, 9, 16)
    compiled = torch.compile(layer, backend=capture, fullgraph=True)
    results = []
    for fn in (compiled, layer):
        xi = x.clone().requires_grad_()
        y = fn(xi)
        y.backward(g)
        results.append((y.detach(), xi.grad, {n: p.grad.clone() for n, p in layer.named_parameters()}))
        layer.zero_grad(set_to_none=True)
    assert "nattn.na_qkv_forward.default" in graphs["fw"]
    assert "nattn.na_qkv_backward.default" in graphs["bw"]
    assert not [op for op in graphs["bw"] if "stack" in op or "cat" in op], graphs["bw"]
    (y1, gx1, gp1), (y2, gx2, gp2) = results
    torch.testing.assert_close(y1, y2)
    torch.testing.assert_close(gx1, gx2)
    for name in gp1:
        torch.testing.assert_close(gp1[name], gp2[name], msg=name)
