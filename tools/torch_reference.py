#!/usr/bin/env python3
"""Reference values from PyTorch for tests/test_torch_reference.cpp: the outputs and gradients of
the later ops of core/api.def (masked_fill to einsum) and of the newer ops and layers (gelu's
tanh form, scaled_dot_product_attention, the recurrent layers and cells, batch norm, Conv1d,
MultiheadAttention, the transformer layers, the convolutions, poolings and resampling modes, the activations,
normalizations and losses of core/ops/activations.cpp, norms.cpp and losses.cpp and the
loss modules of nn/loss.h), RMSprop's parameters after a few steps, the learning rates of the
schedulers, and gradient clipping, on fixed inputs drawn by torch with a fixed seed per case.

Pinned: torch==2.11.0 (the CPU build, or PyPI's wheel run on the CPU) and numpy==2.4.6, the pins
of bench/peers/peers.py, in its venv. Not run by CI: the results are checked in.

    python3 -m venv .venv-peers
    .venv-peers/bin/pip install torch==2.11.0 numpy==2.4.6
    .venv-peers/bin/python tools/torch_reference.py

It rewrites tests/data/torch_ref/ (and nothing else): one folder per case, one .npy per array,
every array float32 unless it is an index (int64), a mask (bool), a batch count (int64) or a
learning rate (float64). In a case's folder:

    in.NAME.npy     an input (x, a mask, a target), or a parameter an optimizer updates
    p.NAME.npy      a module's parameter or buffer, by its state_dict name
    out.NAME.npy    an output (or a buffer after the step, a parameter after N optimizer steps)
    g.NAME.npy      the fixed weights of output NAME in the loss: the test backpropagates
                    sum over outputs of (out * g).sum()
    grad.NAME.npy   the gradient of that loss for input or parameter NAME; an input with a
                    grad file is the one the test marks requires_grad

The test checks every file of a folder, so a case added here fails there until it is checked.

Left out: multinomial, which draws from duet's own Philox generator and cannot reproduce torch's
draws (tests/test_ops_more.cpp checks its distribution instead).
"""
import os
import shutil
import zlib

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "data", "torch_ref")
PINS = ["torch==2.11.0", "numpy==2.4.6"]


def save(path, t):
    a = t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)
    np.save(path, np.array(a, order="C"), allow_pickle=False)  # ascontiguousarray makes 0-d 1-d


class Case:
    """One folder: inputs, a module's state, outputs with their loss weights, gradients."""

    def __init__(self, name):
        self.name = name
        self.dir = os.path.join(OUT, name)
        os.makedirs(self.dir)
        torch.manual_seed(zlib.crc32(name.encode()))
        self.inputs = {}  # name -> leaf tensor whose gradient is saved
        self.module = None
        self.loss = None

    def inp(self, name, t, grad=None):
        """Saves an input; a floating one is a leaf that requires grad unless grad=False."""
        t = t.detach().clone()
        save(os.path.join(self.dir, f"in.{name}.npy"), t)
        if grad is None:
            grad = t.is_floating_point()
        if grad:
            t.requires_grad_(True)
            self.inputs[name] = t
        return t

    def randn(self, name, *shape, grad=None):
        return self.inp(name, torch.randn(*shape), grad)

    def load(self, module):
        """Saves the module's state (parameters and buffers, by state_dict name)."""
        for k, v in module.state_dict().items():
            save(os.path.join(self.dir, f"p.{k}.npy"), v)
        self.module = module
        return module

    def out(self, name, t):
        """Saves an output; a differentiable one gets loss weights g."""
        save(os.path.join(self.dir, f"out.{name}.npy"), t)
        if isinstance(t, torch.Tensor) and t.requires_grad:
            g = torch.randn(t.shape)
            save(os.path.join(self.dir, f"g.{name}.npy"), g)
            term = (t * g).sum()
            self.loss = term if self.loss is None else self.loss + term

    def done(self):
        if self.loss is None:
            return
        self.loss.backward()
        named = dict(self.inputs)
        if self.module is not None:
            named.update(dict(self.module.named_parameters()))
        for k, v in named.items():
            g = v.grad if v.grad is not None else torch.zeros_like(v)
            save(os.path.join(self.dir, f"grad.{k}.npy"), g)


def case(name, body):
    c = Case(name)
    body(c)
    c.done()


# ---- ops of core/api.def, masked_fill to einsum ----


def ops_cases():
    def masked_fill_scalar(c):
        x = c.randn("x", 3, 4)
        m = c.inp("mask", torch.rand(3, 4) < 0.4)
        c.out("out", x.masked_fill(m, -1.5))

    def masked_fill_tensor(c):
        x = c.randn("x", 2, 3, 4)
        m = c.inp("mask", torch.rand(3, 1) < 0.5)
        v = c.inp("value", torch.tensor(0.75))
        c.out("out", x.masked_fill(m, v))

    case("masked_fill_scalar", masked_fill_scalar)
    case("masked_fill_tensor", masked_fill_tensor)
    for d in (-1, 0, 2):
        case(f"tril_{d}", lambda c, d=d: c.out("out", torch.tril(c.randn("x", 2, 4, 5), d)))
        case(f"triu_{d}", lambda c, d=d: c.out("out", torch.triu(c.randn("x", 2, 4, 5), d)))

    def outs(c, ts):
        for i, t in enumerate(ts):
            c.out(f"out{i}", t)

    case("split_size", lambda c: outs(c, torch.split(c.randn("x", 7, 3), 3, 0)))
    case("split_sizes", lambda c: outs(c, torch.split(c.randn("x", 2, 6), [1, 3, 2], 1)))
    case("chunk", lambda c: outs(c, torch.chunk(c.randn("x", 3, 5), 3, 1)))
    case("flip", lambda c: c.out("out", torch.flip(c.randn("x", 2, 3, 4), [0, 2])))
    case("roll_dims",
         lambda c: c.out("out", torch.roll(c.randn("x", 3, 4), shifts=(1, -3), dims=(0, 1))))
    case("roll_flat", lambda c: c.out("out", torch.roll(c.randn("x", 3, 4), 5)))
    case("pad_constant",
         lambda c: c.out("out", F.pad(c.randn("x", 2, 3, 4), (1, 2, 0, 1), "constant", 0.5)))
    case("pad_constant_crop",
         lambda c: c.out("out", F.pad(c.randn("x", 2, 3, 4), (-1, 2), "constant", 0.0)))
    case("pad_reflect_1d", lambda c: c.out("out", F.pad(c.randn("x", 2, 3, 5), (2, 3), "reflect")))
    case("pad_reflect_2d",
         lambda c: c.out("out", F.pad(c.randn("x", 1, 2, 4, 5), (1, 2, 3, 1), "reflect")))

    def likes(c):
        x = c.randn("x", 2, 3, grad=False)
        c.out("zeros", torch.zeros_like(x))
        c.out("ones", torch.ones_like(x))
        c.out("full", torch.full_like(x, 2.5))
        i = c.inp("i", torch.arange(6).reshape(3, 2))
        c.out("full_i", torch.full_like(i, 7))

    case("like", likes)
    case("cumsum_0", lambda c: c.out("out", torch.cumsum(c.randn("x", 5, 3), 0)))
    case("cumsum_1", lambda c: c.out("out", torch.cumsum(c.randn("x", 2, 7), 1)))

    def with_zeros(c, shape, at):
        x = torch.randn(*shape)
        for i in at:
            x[i] = 0
        return c.inp("x", x)

    case("prod_zeros_dim", lambda c: c.out(
        "out", torch.prod(with_zeros(c, (3, 4), [(0, 1), (2, 0), (2, 3)]), 1)))
    case("prod_all", lambda c: c.out("out", torch.prod(c.randn("x", 2, 3))))
    case("cumprod_zero", lambda c: c.out(
        "out", torch.cumprod(with_zeros(c, (2, 5), [(0, 2)]), 1)))
    case("vector_norm_dims", lambda c: c.out(
        "out", torch.linalg.vector_norm(c.randn("x", 2, 3, 4), 3, dim=(0, 2), keepdim=True)))
    case("vector_norm_zero_row", lambda c: c.out(
        "out", torch.linalg.vector_norm(with_zeros(c, (3, 4), [1]), dim=1)))
    case("vector_norm_inf", lambda c: c.out(
        "out", torch.linalg.vector_norm(c.randn("x", 3, 4), float("inf"), dim=1)))

    def cdist_equal(c):
        a = torch.randn(2, 3, 4)
        b = torch.randn(2, 5, 4)
        b[1, 2] = a[1, 0]  # a distance of 0
        c.out("out", torch.cdist(c.inp("x1", a), c.inp("x2", b)))

    case("cdist_equal_rows", cdist_equal)
    case("cdist_p1", lambda c: c.out(
        "out", torch.cdist(c.randn("x1", 4, 3), c.randn("x2", 1, 2, 3), p=1)))

    def lerp_addc(c):
        a, b = c.randn("a", 3, 4), c.randn("b", 3, 4)
        w = c.inp("w", torch.rand(3, 4) * 2 - 0.5)
        c.out("lerp", torch.lerp(a, b, w))
        c.out("lerp_scalar", torch.lerp(a, b, 0.75))
        t = c.inp("t", torch.rand(3, 4) + 0.5)
        c.out("addcdiv", torch.addcdiv(a, b, t, value=0.5))
        c.out("addcmul", torch.addcmul(a, b, t, value=-2))

    case("lerp_addc", lerp_addc)

    def unary_math(c):
        x = c.inp("x", torch.rand(3, 4) * 1.8 - 0.9)
        for name in ("tan", "asin", "acos", "sinh", "cosh", "asinh", "atanh", "exp2"):
            c.out(name, getattr(torch, name)(x))
        c.out("acosh", torch.acosh(x + 2))
        c.out("log2", torch.log2(x + 2))
        c.out("log10", torch.log10(x + 2))
        h = c.inp("h", torch.arange(-6, 6).float() / 2 + 0.25 * (torch.arange(12) % 3 == 0))
        for name in ("round", "trunc", "ceil", "sign"):
            c.out(name, getattr(torch, name)(h))

    case("unary_math", unary_math)

    def arrange(c):
        x = c.randn("x", 2, 3)
        c.out("repeat", x.repeat(2, 1, 2))
        c.out("tile", torch.tile(x, (2,)))
        c.out("interleave", x.repeat_interleave(2, dim=1))
        c.out("interleave_flat", x.repeat_interleave(3))
        c.out("movedim", c.randn("v", 2, 3, 4).movedim((0, 1), (2, 0)))
        c.out("diag_vector", torch.diag(c.randn("d", 3), -1))
        c.out("diag_matrix", torch.diag(x, 1))
        c.out("diag_embed", torch.diag_embed(x, 1, 0, 2))
        c.out("trace", c.randn("m", 3, 4).trace())
        c.out("diff", torch.diff(x, n=1, dim=0, prepend=c.randn("pre", 1, 3)))
        a, b = c.randn("a", 2), c.randn("b", 3)
        gx, gy = torch.meshgrid(a, b, indexing="xy")
        c.out("mesh_x", gx)
        c.out("mesh_y", gy)
        c.out("baddbmm", torch.baddbmm(c.randn("bias", 3, 1), c.randn("b1", 2, 3, 2),
                                       c.randn("b2", 2, 2, 4), beta=0.5, alpha=-2))
        c.out("outer", torch.outer(a, b))

    case("arrange", arrange)
    for corr in (0, 1):
        case(f"var_c{corr}", lambda c, k=corr: c.out(
            "out", torch.var(c.randn("x", 3, 5), dim=1, correction=k)))
        case(f"var_c{corr}_keepdim", lambda c, k=corr: c.out(
            "out", torch.var(c.randn("x", 2, 3, 4), dim=(0, 2), correction=k, keepdim=True)))
        case(f"var_c{corr}_all", lambda c, k=corr: c.out(
            "out", torch.var(c.randn("x", 3, 4), correction=k)))
        case(f"std_c{corr}", lambda c, k=corr: c.out(
            "out", torch.std(c.randn("x", 4, 5), dim=0, correction=k)))
        case(f"std_c{corr}_keepdim", lambda c, k=corr: c.out(
            "out", torch.std(c.randn("x", 2, 3, 4), dim=2, correction=k, keepdim=True)))

    def ties(c, *shape):
        # Small integers: rows with ties, where the gradient is split evenly.
        return c.inp("x", torch.randint(0, 3, shape).float())

    case("amax_dim", lambda c: c.out("out", torch.amax(ties(c, 4, 5), dim=1)))
    case("amax_dims_keepdim",
         lambda c: c.out("out", torch.amax(ties(c, 2, 3, 4), dim=(0, 2), keepdim=True)))
    case("amax_all", lambda c: c.out("out", torch.amax(ties(c, 3, 4))))
    case("amin_dim", lambda c: c.out("out", torch.amin(ties(c, 4, 5), dim=0)))
    case("amin_all", lambda c: c.out("out", torch.amin(ties(c, 3, 4))))

    def max_idx(c):
        v, i = torch.max(c.randn("x", 3, 5), 1)
        c.out("values", v)
        c.out("indices", i)

    def min_idx_keepdim(c):
        v, i = torch.min(c.randn("x", 4, 3, 2), 0, keepdim=True)
        c.out("values", v)
        c.out("indices", i)

    def max_idx_ties(c):
        v, i = torch.max(ties(c, 4, 6), 1)
        c.out("values", v)
        c.out("indices", i)

    def min_idx_ties(c):
        v, i = torch.min(ties(c, 5, 3), 0)
        c.out("values", v)
        c.out("indices", i)

    case("max_with_indices", max_idx)
    case("min_with_indices_keepdim", min_idx_keepdim)
    case("max_with_indices_ties", max_idx_ties)
    case("min_with_indices_ties", min_idx_ties)

    def sort(c, descending, dim):
        v, i = torch.sort(c.randn("x", 3, 6), dim=dim, descending=descending)
        c.out("values", v)
        c.out("indices", i)

    case("sort", lambda c: sort(c, False, -1))
    case("sort_descending_dim0", lambda c: sort(c, True, 0))
    case("argsort", lambda c: c.out("out", torch.argsort(c.randn("x", 4, 5), dim=1)))
    case("argsort_ties_stable", lambda c: c.out(
        "out", torch.argsort(ties(c, 3, 7), dim=1, descending=True, stable=True)))

    def topk(c, k, dim, largest):
        v, i = torch.topk(c.randn("x", 4, 6), k, dim=dim, largest=largest)
        c.out("values", v)
        c.out("indices", i)

    case("topk", lambda c: topk(c, 3, -1, True))
    case("topk_smallest_dim0", lambda c: topk(c, 2, 0, False))
    case("one_hot",
         lambda c: c.out("out", F.one_hot(c.inp("i", torch.tensor([[0, 3], [2, 1]])), 5)))
    case("one_hot_auto", lambda c: c.out("out", F.one_hot(c.inp("i", torch.tensor([1, 0, 4, 2])))))

    def nll(c, shape, target_shape, reduction, ignore=None):
        lp = c.inp("x", torch.log_softmax(torch.randn(*shape), 1 if len(shape) > 1 else 0))
        t = torch.randint(0, shape[1] if len(shape) > 1 else shape[0], target_shape)
        if ignore is not None:
            t.view(-1)[::3] = ignore
        t = c.inp("target", t)
        kw = {} if ignore is None else {"ignore_index": ignore}
        c.out("out", F.nll_loss(lp, t, reduction=reduction, **kw))

    for red in ("mean", "sum", "none"):
        case(f"nll_loss_{red}", lambda c, r=red: nll(c, (5, 4), (5,), r))
        case(f"nll_loss_{red}_ignore", lambda c, r=red: nll(c, (6, 3), (6,), r, ignore=1))
        case(f"nll_loss_{red}_spatial", lambda c, r=red: nll(c, (2, 4, 3), (2, 3), r, ignore=-100))
    case("nll_loss_unbatched", lambda c: nll(c, (5,), (), "mean"))

    einsums = [
        ("matmul", "ij,jk->ik", [(3, 4), (4, 5)]),
        ("bmm", "bij,bjk->bik", [(2, 3, 4), (2, 4, 2)]),
        ("outer", "i,j->ij", [(3,), (4,)]),
        ("transpose", "ij->ji", [(3, 4)]),
        ("dot", "i,i->", [(5,)] * 2),
        ("attention", "bhqd,bhkd->bhqk", [(2, 2, 3, 4), (2, 2, 5, 4)]),
        ("sum_all", "ij->", [(3, 4)]),
        ("implicit", "ij,jk", [(2, 3), (3, 4)]),
        ("sum_first", "ijk,jl->il", [(2, 3, 4), (3, 5)]),
        ("three", "ij,jk,kl->il", [(2, 3), (3, 4), (4, 2)]),
    ]
    for name, eq, shapes in einsums:
        case(f"einsum_{name}", lambda c, eq=eq, shapes=shapes: c.out("out", torch.einsum(
            eq, *[c.randn(f"x{i}", *s) for i, s in enumerate(shapes)])))

    case("gelu_tanh", lambda c: c.out("out", F.gelu(3 * c.randn("x", 4, 5), approximate="tanh")))
    case("gelu", lambda c: c.out("out", F.gelu(3 * c.randn("x", 4, 5))))

    def sdpa(c, l, s, mask=None, causal=False, scale=None):
        q, k, v = c.randn("q", 2, l, 4), c.randn("k", 2, s, 4), c.randn("v", 2, s, 6)
        m = None
        if mask == "bool":
            mm = torch.rand(l, s) < 0.6
            mm[:, 0] = True  # no row fully masked
            m = c.inp("mask", mm)
        elif mask == "float":
            m = c.randn("mask", 2, l, s)
        c.out("out", F.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=causal,
                                                    scale=scale))

    case("sdpa", lambda c: sdpa(c, 3, 5))
    case("sdpa_causal", lambda c: sdpa(c, 4, 4, causal=True))
    case("sdpa_causal_rect", lambda c: sdpa(c, 3, 5, causal=True))
    case("sdpa_bool_mask", lambda c: sdpa(c, 3, 5, mask="bool"))
    case("sdpa_float_mask_scale", lambda c: sdpa(c, 3, 5, mask="float", scale=0.3))

    def clip_params(c):
        ps = []
        for name, shape in (("a", (3, 4)), ("b", (5,)), ("c", (2, 2))):
            ps.append(c.inp(name, torch.randn(*shape), grad=False))
            ps[-1].grad = c.inp(f"{name}_grad", 2 * torch.randn(*shape), grad=False)
        return ps

    def clip_norm(c, max_norm, norm_type):
        ps = clip_params(c)
        total = nn.utils.clip_grad_norm_(ps, max_norm, norm_type)
        c.out("total_norm", total)
        for name, p in zip("abc", ps):
            c.out(name, p.grad)

    case("clip_grad_norm_2", lambda c: clip_norm(c, 1.0, 2.0))
    case("clip_grad_norm_1", lambda c: clip_norm(c, 2.0, 1.0))
    case("clip_grad_norm_inf", lambda c: clip_norm(c, 0.5, float("inf")))
    case("clip_grad_norm_3_noclip", lambda c: clip_norm(c, 100.0, 3.0))

    def clip_value(c):
        ps = clip_params(c)
        nn.utils.clip_grad_value_(ps, 0.8)
        for name, p in zip("abc", ps):
            c.out(name, p.grad)

    case("clip_grad_value", clip_value)


# ---- layers ----


def rnn_case(c, kind, layers, bidirectional, batch_first, with_state, **kw):
    cls = {"rnn": nn.RNN, "gru": nn.GRU, "lstm": nn.LSTM}[kind]
    m = c.load(cls(3, 4, num_layers=layers, bidirectional=bidirectional,
                   batch_first=batch_first, **kw))
    t, n, dirs = 5, 2, 2 if bidirectional else 1
    x = c.randn("x", *((n, t, 3) if batch_first else (t, n, 3)))
    state = None
    if with_state:
        state = c.randn("h0", layers * dirs, n, 4)
        if kind == "lstm":
            state = (state, c.randn("c0", layers * dirs, n, 4))
    rnn_outputs(c, kind, *m(x, state))


def rnn_unbatched(c, kind):
    cls = {"rnn": nn.RNN, "gru": nn.GRU, "lstm": nn.LSTM}[kind]
    m = c.load(cls(3, 4))
    rnn_outputs(c, kind, *m(c.randn("x", 5, 3)))


def rnn_outputs(c, kind, out, s):
    """A recurrent layer's results: out, then h_n (and c_n for an LSTM)."""
    c.out("out", out)
    if kind == "lstm":
        c.out("h_n", s[0])
        c.out("c_n", s[1])
    else:
        c.out("h_n", s)


def cell_case(c, kind, with_state, batched=True, **kw):
    cls = {"rnn": nn.RNNCell, "gru": nn.GRUCell, "lstm": nn.LSTMCell}[kind]
    m = c.load(cls(3, 4, **kw))
    lead = (2,) if batched else ()
    x = c.randn("x", *lead, 3)
    state = None
    if with_state:
        state = c.randn("h0", *lead, 4)
        if kind == "lstm":
            state = (state, c.randn("c0", *lead, 4))
    r = m(x, state)
    if kind == "lstm":
        c.out("h", r[0])
        c.out("c", r[1])
    else:
        c.out("h", r)


def randomize_bn(m, nbt=0):
    with torch.no_grad():
        m.weight.copy_(1 + 0.5 * torch.randn(m.weight.shape))
        m.bias.copy_(0.5 * torch.randn(m.bias.shape))
        m.running_mean.copy_(torch.randn(m.running_mean.shape))
        m.running_var.copy_(0.5 + torch.rand(m.running_var.shape))
        m.num_batches_tracked.fill_(nbt)


def bn_case(c, cls, shape, train, momentum=0.1, steps=1):
    m = cls(shape[1], momentum=momentum)
    randomize_bn(m, nbt=2)
    c.load(m)
    m.train(train)
    for s in range(steps):
        c.out(f"y{s}", m(c.randn(f"x{s}", *shape)))
    if train:
        c.out("running_mean", m.running_mean)
        c.out("running_var", m.running_var)
        c.out("num_batches_tracked", m.num_batches_tracked)


def conv1d_case(c, stride, padding, batched=True, bias=True):
    m = c.load(nn.Conv1d(3, 4, 3, stride=stride, padding=padding, bias=bias))
    c.out("out", m(c.randn("x", *((2, 3, 9) if batched else (3, 9)))))


def mha_case(c, l, s, mask=None, weights=True):
    m = nn.MultiheadAttention(8, 2, batch_first=True)
    with torch.no_grad():  # nonzero biases, which PyTorch's initialization leaves at zero
        m.in_proj_bias.copy_(0.1 * torch.randn(m.in_proj_bias.shape))
        m.out_proj.bias.copy_(0.1 * torch.randn(m.out_proj.bias.shape))
    c.load(m)
    q = c.randn("q", 2, l, 8)
    k, v = (q, q) if s is None else (c.randn("k", 2, s, 8), c.randn("v", 2, s, 8))
    s = l if s is None else s
    am = None
    if mask == "bool":
        mm = torch.rand(l, s) < 0.4
        mm[:, 0] = False  # no row fully masked (true = not allowed)
        am = c.inp("mask", mm)
    elif mask == "float":
        am = c.randn("mask", 2 * 2, l, s)
    elif mask == "causal":
        am = torch.triu(torch.ones(l, s, dtype=torch.bool), 1)  # what duet's is_causal applies
    out, w = m(q, k, v, attn_mask=am, need_weights=weights, is_causal=mask == "causal")
    c.out("out", out)
    if weights:
        c.out("weights", w)


def mha_key_padding(c):
    m = c.load(nn.MultiheadAttention(8, 2, batch_first=True))
    q = c.randn("q", 2, 4, 8)
    kpm = torch.tensor([[False, False, True, True], [False, True, False, False]])
    am = torch.rand(4, 4) < 0.3
    am[:, 0] = False
    out, w = m(q, q, q, key_padding_mask=c.inp("key_padding_mask", kpm),
               attn_mask=c.inp("mask", am))
    c.out("out", out)
    c.out("weights", w)


def encoder_layer(batch_first, norm_first):
    """A layer of d_model 8, 2 heads and a feed-forward of 16, with nonzero biases, in eval."""
    m = nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.1, batch_first=batch_first,
                                   norm_first=norm_first,
                                   activation="gelu" if norm_first else "relu")
    with torch.no_grad():
        m.self_attn.in_proj_bias.copy_(0.1 * torch.randn(24))
        m.self_attn.out_proj.bias.copy_(0.1 * torch.randn(8))
        for norm in (m.norm1, m.norm2):
            norm.weight.copy_(1 + 0.1 * torch.randn(8))
            norm.bias.copy_(0.1 * torch.randn(8))
    return m.eval()


def encoder_case(c, norm_first):
    """Post-norm with relu, sequence first, and a key padding mask; pre-norm with gelu, batch
    first, and a floating (causal) mask."""
    m = c.load(encoder_layer(batch_first=norm_first, norm_first=norm_first))
    if norm_first:
        x = c.randn("x", 2, 5, 8)
        mask = c.inp("mask", torch.triu(torch.full((5, 5), float("-inf")), 1), grad=False)
        c.out("out", m(x, src_mask=mask))
    else:
        x = c.randn("x", 5, 2, 8)
        kpm = c.inp("key_padding_mask", torch.tensor([[False] * 5, [False, False, False, True,
                                                                    True]]))
        c.out("out", m(x, src_key_padding_mask=kpm))


def encoder_stack_case(c):
    layer = encoder_layer(batch_first=True, norm_first=False)
    m = nn.TransformerEncoder(layer, 2, norm=nn.LayerNorm(8), enable_nested_tensor=False)
    with torch.no_grad():  # layers that differ
        for p in m.layers[1].parameters():
            p.add_(0.05 * torch.randn(p.shape))
    c.load(m.eval())
    x = c.randn("x", 2, 4, 8)
    am = torch.rand(4, 4) < 0.3
    am[:, 0] = False
    c.out("out", m(x, mask=c.inp("mask", am)))


def decoder_layer(batch_first, norm_first):
    """A decoder layer of d_model 8, 2 heads and a feed-forward of 16, nonzero biases, in eval."""
    m = nn.TransformerDecoderLayer(8, 2, dim_feedforward=16, dropout=0.1, batch_first=batch_first,
                                   norm_first=norm_first,
                                   activation="gelu" if norm_first else "relu")
    with torch.no_grad():
        for attn in (m.self_attn, m.multihead_attn):
            attn.in_proj_bias.copy_(0.1 * torch.randn(24))
            attn.out_proj.bias.copy_(0.1 * torch.randn(8))
        for norm in (m.norm1, m.norm2, m.norm3):
            norm.weight.copy_(1 + 0.1 * torch.randn(8))
            norm.bias.copy_(0.1 * torch.randn(8))
    return m.eval()


def decoder_case(c, norm_first):
    """Post-norm with relu, sequence first, a causal target mask and a memory padding mask;
    pre-norm with gelu, batch first, a b8 memory mask."""
    m = c.load(decoder_layer(batch_first=norm_first, norm_first=norm_first))
    causal = torch.triu(torch.full((4, 4), float("-inf")), 1)
    if norm_first:
        t, mem = c.randn("tgt", 2, 4, 8), c.randn("memory", 2, 5, 8)
        mm = torch.rand(4, 5) < 0.3
        mm[:, 0] = False
        c.out("out", m(t, mem, memory_mask=c.inp("memory_mask", mm)))
    else:
        t, mem = c.randn("tgt", 4, 2, 8), c.randn("memory", 5, 2, 8)
        kpm = torch.tensor([[False] * 5, [False, False, True, False, True]])
        c.out("out", m(t, mem, tgt_mask=c.inp("tgt_mask", causal, grad=False),
                       memory_key_padding_mask=c.inp("memory_key_padding_mask", kpm)))


def decoder_stack_case(c):
    m = nn.TransformerDecoder(decoder_layer(batch_first=True, norm_first=False), 2,
                              norm=nn.LayerNorm(8))
    with torch.no_grad():  # layers that differ
        for p in m.layers[1].parameters():
            p.add_(0.05 * torch.randn(p.shape))
    c.load(m.eval())
    t, mem = c.randn("tgt", 2, 4, 8), c.randn("memory", 2, 3, 8)
    causal = torch.triu(torch.full((4, 4), float("-inf")), 1)
    c.out("out", m(t, mem, tgt_mask=c.inp("tgt_mask", causal, grad=False)))


def transformer_case(c):
    m = nn.Transformer(d_model=8, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
                       dim_feedforward=16, batch_first=True)
    with torch.no_grad():  # nonzero biases and norms that are not the identity
        for k, p in m.named_parameters():
            if p.dim() == 1:
                p.copy_((1 if k.endswith("norm1.weight") or k.endswith("norm.weight") else 0)
                        + 0.1 * torch.randn(p.shape))
    c.load(m.eval())
    src, tgt = c.randn("src", 2, 5, 8), c.randn("tgt", 2, 4, 8)
    kpm = c.inp("src_key_padding_mask", torch.tensor([[False] * 5, [False, False, False, True,
                                                                    True]]))
    tgt_mask = c.inp("tgt_mask", nn.Transformer.generate_square_subsequent_mask(4), grad=False)
    c.out("out", m(src, tgt, tgt_mask=tgt_mask, src_key_padding_mask=kpm,
                   memory_key_padding_mask=kpm))


def encoder_no_bias_case(c):
    m = nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, batch_first=True, bias=False)
    with torch.no_grad():
        for norm in (m.norm1, m.norm2):
            norm.weight.copy_(1 + 0.1 * torch.randn(8))
    c.load(m.eval())
    c.out("out", m(c.randn("x", 2, 5, 8)))


def layer_cases():
    for kind in ("rnn", "gru", "lstm"):
        kws = [("", {})] if kind != "rnn" else [("_tanh", {}),
                                                ("_relu", {"nonlinearity": "relu"})]
        for sfx, kw in kws:
            case(f"{kind}{sfx}", lambda c, k=kind, kw=kw: rnn_case(c, k, 1, False, False, False,
                                                                  **kw))
            case(f"{kind}{sfx}_2layer_bidir_state",
                 lambda c, k=kind, kw=kw: rnn_case(c, k, 2, True, False, True, **kw))
            case(f"{kind}{sfx}_batch_first_state",
                 lambda c, k=kind, kw=kw: rnn_case(c, k, 2, False, True, True, **kw))
            case(f"{kind}{sfx}_bidir_batch_first",
                 lambda c, k=kind, kw=kw: rnn_case(c, k, 1, True, True, False, **kw))
        case(f"{kind}_unbatched", lambda c, k=kind: rnn_unbatched(c, k))
        case(f"{kind}_no_bias", lambda c, k=kind: rnn_case(c, k, 1, False, False, True, bias=False))
    for kind in ("rnn", "gru", "lstm"):
        case(f"{kind}_cell", lambda c, k=kind: cell_case(c, k, False))
        case(f"{kind}_cell_state", lambda c, k=kind: cell_case(c, k, True))
        case(f"{kind}_cell_unbatched_state", lambda c, k=kind: cell_case(c, k, True, False))
    case("rnn_cell_relu_state", lambda c: cell_case(c, "rnn", True, nonlinearity="relu"))

    case("batchnorm1d_2d_train", lambda c: bn_case(c, nn.BatchNorm1d, (6, 3), True))
    case("batchnorm1d_3d_train", lambda c: bn_case(c, nn.BatchNorm1d, (4, 3, 5), True))
    case("batchnorm2d_train", lambda c: bn_case(c, nn.BatchNorm2d, (3, 2, 4, 3), True))
    case("batchnorm3d_train", lambda c: bn_case(c, nn.BatchNorm3d, (2, 3, 2, 3, 2), True))
    case("batchnorm1d_cumulative_train",
         lambda c: bn_case(c, nn.BatchNorm1d, (5, 3), True, momentum=None, steps=2))
    case("batchnorm1d_eval", lambda c: bn_case(c, nn.BatchNorm1d, (4, 3, 5), False))
    case("batchnorm2d_eval", lambda c: bn_case(c, nn.BatchNorm2d, (3, 2, 4, 3), False))
    case("batchnorm3d_eval", lambda c: bn_case(c, nn.BatchNorm3d, (2, 3, 2, 3, 2), False))

    case("conv1d", lambda c: conv1d_case(c, 1, 0))
    case("conv1d_stride2_pad1", lambda c: conv1d_case(c, 2, 1))
    case("conv1d_unbatched_no_bias", lambda c: conv1d_case(c, 1, 2, batched=False, bias=False))

    case("mha_self", lambda c: mha_case(c, 4, None))
    case("mha_cross", lambda c: mha_case(c, 3, 5))
    case("mha_bool_mask", lambda c: mha_case(c, 3, 5, mask="bool"))
    case("mha_float_mask", lambda c: mha_case(c, 3, 5, mask="float"))
    case("mha_causal", lambda c: mha_case(c, 4, None, mask="causal"))
    case("mha_key_padding_mask", mha_key_padding)

    def mha_causal_key_padding(c):
        m = c.load(nn.MultiheadAttention(8, 2, batch_first=True))
        q = c.randn("q", 2, 4, 8)
        kpm = torch.tensor([[False, False, False, True], [False, True, False, False]])
        out, _ = m(q, q, q, key_padding_mask=c.inp("key_padding_mask", kpm), need_weights=False,
                   attn_mask=torch.triu(torch.ones(4, 4, dtype=torch.bool), 1), is_causal=True)
        c.out("out", out)

    case("mha_causal_key_padding_mask", mha_causal_key_padding)
    case("transformer_encoder_layer", lambda c: encoder_case(c, False))
    case("transformer_encoder_layer_norm_first_gelu", lambda c: encoder_case(c, True))
    case("transformer_encoder", encoder_stack_case)
    case("transformer_decoder_layer", lambda c: decoder_case(c, False))
    case("transformer_decoder_layer_norm_first_gelu", lambda c: decoder_case(c, True))
    case("transformer_decoder", decoder_stack_case)
    case("transformer", transformer_case)
    case("transformer_encoder_layer_no_bias", encoder_no_bias_case)


# ---- convolutions, poolings and resampling ----


def window_cases():
    def conv1d_layer(c, stride, padding, groups, dilation, mode="zeros"):
        m = c.load(nn.Conv1d(4, 6, 3, stride=stride, padding=padding, groups=groups,
                             dilation=dilation, padding_mode=mode))
        c.out("out", m(c.randn("x", 2, 4, 11)))

    case("conv1d_groups_dilation", lambda c: conv1d_layer(c, 2, 1, 2, 2))
    case("conv1d_same_circular", lambda c: conv1d_layer(c, 1, "same", 1, 3, "circular"))
    case("conv1d_same_even_kernel", lambda c: c.out("out", F.conv1d(
        c.randn("x", 2, 3, 7), c.randn("w", 2, 3, 4), c.randn("b", 2), padding="same")))
    case("max_pool1d", lambda c: c.out("out", F.max_pool1d(
        c.randn("x", 2, 3, 10), 3, 2, 1, 2, ceil_mode=True)))
    case("avg_pool1d", lambda c: c.out("out", F.avg_pool1d(
        c.randn("x", 3, 10), 3, 2, 1, ceil_mode=True, count_include_pad=False)))

    def adaptive(c, shape, size, f_avg, f_max):
        x = c.randn("x", *shape)
        c.out("avg", f_avg(x, size))
        c.out("max", f_max(x, size))

    case("adaptive_pool1d", lambda c: adaptive(c, (2, 3, 10), 4, F.adaptive_avg_pool1d,
                                               F.adaptive_max_pool1d))
    case("adaptive_pool2d", lambda c: adaptive(c, (1, 2, 7, 9), (3, 4), F.adaptive_avg_pool2d,
                                               F.adaptive_max_pool2d))
    case("max_pool2d", lambda c: c.out("out", F.max_pool2d(
        c.randn("x", 2, 3, 7, 6), (3, 2), (2, 1), (1, 0), (1, 2), ceil_mode=True)))
    case("avg_pool2d_exclude_pad", lambda c: c.out("out", F.avg_pool2d(
        c.randn("x", 2, 3, 7, 6), 3, 2, 1, ceil_mode=True, count_include_pad=False)))
    case("avg_pool2d_divisor", lambda c: c.out("out", F.avg_pool2d(
        c.randn("x", 1, 2, 6, 7), 3, 2, 1, divisor_override=4)))

    def conv_transpose(c):
        m = c.load(nn.ConvTranspose2d(4, 6, (3, 2), (2, 1), (1, 0), (1, 0), groups=2,
                                      dilation=(1, 2)))
        c.out("out", m(c.randn("x", 2, 4, 4, 3)))

    case("conv_transpose2d", conv_transpose)

    def conv_transpose_size(c):
        m = c.load(nn.ConvTranspose2d(3, 2, 3, (2, 3), 1))
        c.out("out", m(c.randn("x", 1, 3, 4, 3), output_size=(8, 9)))

    case("conv_transpose2d_output_size", conv_transpose_size)

    def resample(c, mode, align=None, **kw):
        x = c.randn("x", 1, 2, 4, 5)
        c.out("out", F.interpolate(x, mode=mode, align_corners=align, **kw))

    case("interpolate_bicubic", lambda c: resample(c, "bicubic", False, size=(7, 3)))
    case("interpolate_bicubic_align", lambda c: resample(c, "bicubic", True, size=(6, 8)))
    case("interpolate_bicubic_scale", lambda c: resample(c, "bicubic", False, scale_factor=1.5))
    case("interpolate_bilinear", lambda c: resample(c, "bilinear", False, size=(3, 9)))
    case("interpolate_nearest_exact", lambda c: resample(c, "nearest-exact", size=(7, 3)))
    case("interpolate_area", lambda c: resample(c, "area", size=(3, 2)))

    def conv3d_layer(c, stride, padding, groups, dilation, mode="zeros", batched=True):
        m = c.load(nn.Conv3d(4, 6, (3, 2, 3), stride=stride, padding=padding, groups=groups,
                             dilation=dilation, padding_mode=mode))
        shape = (2, 4, 7, 6, 8) if batched else (4, 7, 6, 8)
        c.out("out", m(c.randn("x", *shape)))

    case("conv3d_groups_dilation", lambda c: conv3d_layer(c, (2, 1, 2), (1, 0, 2), 2, (1, 2, 1)))
    case("conv3d_same_replicate",
         lambda c: conv3d_layer(c, 1, "same", 1, (2, 1, 1), "replicate", batched=False))
    case("conv3d_same_even_kernel", lambda c: c.out("out", F.conv3d(
        c.randn("x", 1, 3, 5, 4, 6), c.randn("w", 2, 3, 2, 3, 4), c.randn("b", 2), padding="same")))
    case("max_pool3d", lambda c: c.out("out", F.max_pool3d(
        c.randn("x", 2, 3, 7, 6, 8), (3, 2, 3), (2, 1, 2), (1, 0, 1), (1, 2, 1), ceil_mode=True)))
    case("avg_pool3d_exclude_pad", lambda c: c.out("out", F.avg_pool3d(
        c.randn("x", 3, 7, 6, 5), 3, 2, 1, ceil_mode=True, count_include_pad=False)))
    case("avg_pool3d_divisor", lambda c: c.out("out", F.avg_pool3d(
        c.randn("x", 1, 2, 5, 6, 7), (2, 3, 3), 2, 1, divisor_override=5)))
    case("adaptive_pool3d", lambda c: adaptive(c, (1, 2, 5, 7, 9), (2, 3, 4),
                                               F.adaptive_avg_pool3d, F.adaptive_max_pool3d))

    def conv_transpose3d(c):
        m = c.load(nn.ConvTranspose3d(4, 6, (2, 3, 2), (2, 1, 2), (1, 1, 0), (1, 0, 1), groups=2,
                                      dilation=(1, 2, 1)))
        c.out("out", m(c.randn("x", 2, 4, 3, 4, 3)))

    case("conv_transpose3d", conv_transpose3d)

    def conv_transpose3d_size(c):
        m = c.load(nn.ConvTranspose3d(3, 2, 3, (2, 1, 3), (1, 0, 1)))
        c.out("out", m(c.randn("x", 3, 3, 4, 3), output_size=(6, 6, 8)))

    case("conv_transpose3d_output_size", conv_transpose3d_size)

    def resample_nd(c, shape, **kw):
        c.out("out", F.interpolate(c.randn("x", *shape), **kw))

    case("interpolate_linear_align", lambda c: resample_nd(c, (2, 3, 7), size=11, mode="linear",
                                                           align_corners=True))
    case("interpolate_nearest_1d_scale", lambda c: resample_nd(c, (2, 3, 5), scale_factor=2.5))
    case("interpolate_trilinear", lambda c: resample_nd(c, (1, 2, 3, 4, 5), size=(5, 3, 8),
                                                        mode="trilinear"))
    case("interpolate_trilinear_scale", lambda c: resample_nd(c, (1, 2, 3, 4, 2),
                                                              scale_factor=1.5, mode="trilinear"))
    case("interpolate_area_3d", lambda c: resample_nd(c, (1, 2, 5, 4, 6), size=(2, 3, 4),
                                                      mode="area"))


# ---- activations, normalizations and losses ----


def activation_cases():
    def act(c, f):
        c.out("out", f(3 * c.randn("x", 4, 5)))

    case("leaky_relu", lambda c: act(c, lambda x: F.leaky_relu(x, 0.2)))
    case("elu", lambda c: act(c, lambda x: F.elu(x, 0.7)))
    case("selu", lambda c: act(c, F.selu))
    case("celu", lambda c: act(c, lambda x: F.celu(x, 1.5)))
    case("hardtanh", lambda c: act(c, lambda x: F.hardtanh(x, -0.5, 2.0)))
    case("relu6", lambda c: act(c, lambda x: F.relu6(2 * x)))
    case("hardsigmoid", lambda c: act(c, F.hardsigmoid))
    case("hardswish", lambda c: act(c, F.hardswish))
    case("mish", lambda c: act(c, F.mish))
    case("glu", lambda c: c.out("out", F.glu(c.randn("x", 3, 4, 6), 1)))

    def prelu(c):
        m = nn.PReLU(3, 0.1)
        with torch.no_grad():
            m.weight.copy_(torch.randn(3))
        c.load(m)
        c.out("out", m(c.randn("x", 2, 3, 4)))

    case("prelu", prelu)

    def rms(c, eps):
        m = nn.RMSNorm((3, 4), eps=eps)
        with torch.no_grad():
            m.weight.copy_(torch.randn(3, 4))
        c.load(m)
        c.out("out", m(c.randn("x", 2, 3, 4)))

    case("rms_norm", lambda c: rms(c, 1e-6))
    case("rms_norm_default_eps", lambda c: rms(c, None))

    def group(c):
        m = nn.GroupNorm(2, 6)
        with torch.no_grad():
            m.weight.copy_(torch.randn(6))
            m.bias.copy_(torch.randn(6))
        c.load(m)
        c.out("out", m(c.randn("x", 2, 6, 5)))

    case("group_norm", group)

    def instance(c):
        m = nn.InstanceNorm2d(3, affine=True)
        with torch.no_grad():
            m.weight.copy_(torch.randn(3))
            m.bias.copy_(torch.randn(3))
        c.load(m)
        c.out("out", m(c.randn("x", 2, 3, 4, 3)))

    case("instance_norm2d", instance)

    def instance_tracked(c, cls, shape, train):
        m = cls(3, momentum=0.2, affine=True, track_running_stats=True)
        with torch.no_grad():
            m.weight.copy_(torch.rand(3) + 0.5)
            m.bias.copy_(torch.randn(3))
            m.running_mean.copy_(torch.randn(3))
            m.running_var.copy_(torch.rand(3) + 0.5)
        c.load(m)
        m.train(train)
        c.out("out", m(c.randn("x", *shape)))
        if train:
            c.out("running_mean", m.running_mean)
            c.out("running_var", m.running_var)

    case("instance_norm1d_tracked_train",
         lambda c: instance_tracked(c, nn.InstanceNorm1d, (2, 3, 5), True))
    case("instance_norm2d_tracked_eval_unbatched",
         lambda c: instance_tracked(c, nn.InstanceNorm2d, (3, 4, 2), False))
    case("normalize", lambda c: c.out("out", F.normalize(c.randn("x", 3, 5), p=3.0, dim=1)))
    case("cosine_similarity", lambda c: c.out("out", F.cosine_similarity(
        c.randn("a", 3, 5, 2), c.randn("b", 3, 5, 2), dim=1)))

    def loss(c, f, **kw):
        x, t = c.randn("x", 4, 5), c.randn("t", 4, 5)
        c.out("out", f(x, t, **kw))

    case("l1_loss", lambda c: loss(c, F.l1_loss))
    case("smooth_l1_loss", lambda c: loss(c, F.smooth_l1_loss, beta=0.5, reduction="sum"))
    case("huber_loss", lambda c: loss(c, F.huber_loss, delta=0.7, reduction="none"))
    case("mse_loss_sum", lambda c: loss(c, F.mse_loss, reduction="sum"))

    def kl(c, log_target, reduction):
        x = c.inp("x", torch.log_softmax(torch.randn(4, 5), 1))
        p = torch.softmax(torch.randn(4, 5), 1)
        t = c.inp("t", p.log() if log_target else p)
        c.out("out", F.kl_div(x, t, reduction=reduction, log_target=log_target))

    case("kl_div_batchmean", lambda c: kl(c, False, "batchmean"))
    case("kl_div_log_target", lambda c: kl(c, True, "none"))

    def bce(c, reduction):
        m = c.load(nn.BCELoss(weight=torch.rand(5) + 0.5, reduction=reduction))
        x = c.inp("x", torch.rand(4, 5) * 0.98 + 0.01)
        t = c.inp("t", torch.rand(4, 5), grad=False)
        c.out("out", m(x, t))

    case("bce_loss_weight", lambda c: bce(c, "mean"))
    case("bce_loss_none", lambda c: bce(c, "none"))

    def bce_logits(c, reduction):
        m = c.load(nn.BCEWithLogitsLoss(weight=torch.rand(4, 1) + 0.5, reduction=reduction,
                                        pos_weight=torch.rand(5) * 3))
        x = c.inp("x", torch.randn(4, 5) * 3)
        t = c.inp("t", torch.rand(4, 5), grad=False)
        c.out("out", m(x, t))

    case("bce_with_logits_weights", lambda c: bce_logits(c, "sum"))
    case("bce_with_logits_none", lambda c: bce_logits(c, "none"))

    def nll(c, reduction):
        m = c.load(nn.NLLLoss(weight=torch.rand(5) + 0.5, ignore_index=2, reduction=reduction))
        x = c.inp("x", torch.log_softmax(torch.randn(6, 5, 3), 1))
        t = c.inp("t", torch.tensor([[0, 2, 4], [1, 1, 2], [3, 0, 4], [2, 2, 1], [4, 3, 0],
                                     [1, 4, 3]]))
        c.out("out", m(x, t))

    case("nll_loss_weight", lambda c: nll(c, "mean"))
    case("nll_loss_weight_none", lambda c: nll(c, "none"))

    def ce_module(c):
        m = c.load(nn.CrossEntropyLoss(weight=torch.rand(5) + 0.5, ignore_index=1,
                                       label_smoothing=0.2))
        x = c.randn("x", 6, 5)
        t = c.inp("t", torch.tensor([0, 1, 4, 3, 1, 2]))
        c.out("out", m(x, t))

    case("cross_entropy_loss_module", ce_module)

    def pm(c, name, n):  # a target of +-1, fixed by the case's seed
        return c.inp(name, torch.randint(0, 2, (n,)).float() * 2 - 1, grad=False)

    case("margin_ranking_loss", lambda c: c.out("out", nn.MarginRankingLoss(margin=0.2)(
        c.randn("x1", 6), c.randn("x2", 6), pm(c, "y", 6))))
    case("hinge_embedding_loss", lambda c: c.out("out", nn.HingeEmbeddingLoss(
        margin=0.7, reduction="sum")(c.randn("x", 12), pm(c, "y", 12))))
    case("soft_margin_loss", lambda c: c.out("out", nn.SoftMarginLoss()(
        c.randn("x", 12), pm(c, "y", 12))))
    case("cosine_embedding_loss", lambda c: c.out("out", nn.CosineEmbeddingLoss(margin=0.1)(
        c.randn("x1", 4, 5), c.randn("x2", 4, 5), pm(c, "y", 4))))
    case("triplet_margin_loss_swap", lambda c: c.out("out", nn.TripletMarginLoss(
        margin=0.5, swap=True)(c.randn("a", 4, 5), c.randn("p", 4, 5), c.randn("n", 4, 5))))

    def poisson(c):
        x = c.inp("x", torch.rand(3, 4) * 3 + 0.2)
        t = c.inp("t", torch.randint(0, 5, (3, 4)).float(), grad=False)
        c.out("out", nn.PoissonNLLLoss(log_input=False, full=True)(x, t))

    case("poisson_nll_loss_full", poisson)

    def gaussian(c):
        x, t = c.randn("x", 3, 4), c.randn("t", 3, 4)
        var = c.inp("var", torch.rand(3, 1) + 0.2)
        c.out("out", nn.GaussianNLLLoss(full=True)(x, t, var))

    case("gaussian_nll_loss_full", gaussian)
    case("multilabel_soft_margin_loss", lambda c: c.out("out", nn.MultiLabelSoftMarginLoss(
        weight=c.inp("w", torch.rand(5) + 0.5, grad=False))(
        c.randn("x", 4, 5), c.inp("y", torch.randint(0, 2, (4, 5)).float(), grad=False))))
    case("multi_margin_loss", lambda c: c.out("out", nn.MultiMarginLoss(
        p=2, margin=0.7, weight=c.inp("w", torch.rand(5) + 0.5, grad=False))(
        c.randn("x", 4, 5), c.inp("y", torch.tensor([0, 3, 4, 3])))))
    case("multilabel_margin_loss", lambda c: c.out("out", nn.MultiLabelMarginLoss(
        reduction="none")(c.randn("x", 3, 5), c.inp("y", torch.tensor(
            [[3, 0, -1, 1, 2], [1, 2, 4, 0, 3], [-1, 2, 2, 2, 2]])))))
    case("embedding_bag_sum_weighted", lambda c: c.out("out", F.embedding_bag(
        c.inp("input", torch.tensor([0, 2, 2, 5, 1, 3, 0])), c.randn("weight", 6, 3),
        c.inp("offsets", torch.tensor([0, 2, 2, 5])), mode="sum",
        per_sample_weights=c.randn("psw", 7))))
    case("embedding_bag_mean_padding_last_offset", lambda c: c.out("out", F.embedding_bag(
        c.inp("input", torch.tensor([1, 2, 1, 4, 1, 3, 0])), c.randn("weight", 6, 3),
        c.inp("offsets", torch.tensor([0, 3, 3, 4, 7])), mode="mean", padding_idx=1,
        include_last_offset=True)))
    case("embedding_bag_max_padding", lambda c: c.out("out", F.embedding_bag(
        c.inp("input", torch.tensor([1, 2, 1, 4, 1, 3, 0, 5])), c.randn("weight", 6, 3),
        c.inp("offsets", torch.tensor([0, 3, 3, 4])), mode="max", padding_idx=1)))
    case("embedding_bag_2d", lambda c: c.out("out", F.embedding_bag(
        c.inp("input", torch.tensor([[4, 0, 2, 2], [1, 1, 3, 5], [0, 0, 0, 0]])),
        c.randn("weight", 6, 3))))
    case("pairwise_distance", lambda c: c.out("out", nn.PairwiseDistance(p=1.5, keepdim=True)(
        c.randn("x1", 3, 4), c.randn("x2", 3, 4))))
    case("cosine_similarity_module", lambda c: c.out("out", nn.CosineSimilarity(dim=0)(
        c.randn("a", 4, 3), c.randn("b", 4, 3))))

    def embedding_pad(c):
        m = c.load(nn.Embedding(6, 3, padding_idx=4))
        c.out("out", m(c.inp("i", torch.tensor([[4, 1, 4], [0, 3, 4]]))))

    case("embedding_padding_idx", embedding_pad)


# ---- optimizers and schedulers ----


def rmsprop_case(c, steps=5, **kw):
    x = c.randn("x", 6, 3, grad=False)
    y = c.randn("y", 6, 2, grad=False)
    w = c.inp("w", torch.randn(2, 3), grad=False).requires_grad_()
    b = c.inp("b", torch.randn(2), grad=False).requires_grad_()
    opt = torch.optim.RMSprop([w, b], **kw)
    for s in range(1, steps + 1):
        opt.zero_grad()
        F.mse_loss(F.linear(x, w, b), y).backward()
        opt.step()
        c.out(f"w{s}", w.detach())
        c.out(f"b{s}", b.detach())


def optim_cases():
    case("rmsprop", lambda c: rmsprop_case(c))
    case("rmsprop_momentum", lambda c: rmsprop_case(c, lr=0.02, momentum=0.9))
    case("rmsprop_centered", lambda c: rmsprop_case(c, centered=True))
    case("rmsprop_all", lambda c: rmsprop_case(c, lr=0.005, alpha=0.9, eps=1e-6,
                                               weight_decay=0.1, momentum=0.5, centered=True))


def schedule(c, make, values=30):
    p = torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([p], lr=0.1)
    sched = make(opt)
    lrs = [sched.get_last_lr()[0]]
    while len(lrs) < values:
        opt.step()
        sched.step()
        lrs.append(sched.get_last_lr()[0])
    c.out("lr", np.array(lrs, dtype=np.float64))


def scheduler_cases():
    S = torch.optim.lr_scheduler
    case("step_lr", lambda c: schedule(c, lambda o: S.StepLR(o, 7, 0.5)))
    case("cosine_annealing_lr",
         lambda c: schedule(c, lambda o: S.CosineAnnealingLR(o, T_max=10, eta_min=0.01)))
    case("linear_lr", lambda c: schedule(c, lambda o: S.LinearLR(o, 0.25, 1.0, 8)))
    case("one_cycle_lr", lambda c: schedule(
        c, lambda o: S.OneCycleLR(o, max_lr=0.5, total_steps=30, cycle_momentum=False), 31))
    case("one_cycle_lr_linear_three_phase", lambda c: schedule(
        c, lambda o: S.OneCycleLR(o, max_lr=0.4, total_steps=30, pct_start=0.25,
                                  anneal_strategy="linear", div_factor=10, final_div_factor=100,
                                  three_phase=True, cycle_momentum=False)))

    def sequential(o):
        return S.SequentialLR(o, [S.LinearLR(o, 0.1, 1.0, 5),
                                  S.CosineAnnealingLR(o, T_max=20, eta_min=0.001)], milestones=[5])

    def sequential3(o):
        return S.SequentialLR(o, [S.LinearLR(o, 0.2, 1.0, 4), S.StepLR(o, 3, 0.5),
                                  S.CosineAnnealingLR(o, T_max=8)], milestones=[4, 12])

    case("sequential_lr", lambda c: schedule(c, sequential))
    case("sequential_lr_three", lambda c: schedule(c, sequential3))


def main():
    assert torch.__version__.split("+")[0] == PINS[0].split("==")[1], torch.__version__
    assert np.__version__ == PINS[1].split("==")[1], np.__version__
    torch.set_num_threads(1)
    if os.path.exists(OUT):
        shutil.rmtree(OUT)
    os.makedirs(OUT)
    ops_cases()
    layer_cases()
    window_cases()
    activation_cases()
    optim_cases()
    scheduler_cases()
    n = len(os.listdir(OUT))
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(OUT) for f in fs)
    print(f"torch_reference: {n} cases, {size} bytes in {os.path.relpath(OUT, ROOT)}")


if __name__ == "__main__":
    main()
