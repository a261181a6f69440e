// ONNX import: the mappings of ops whose results are placed or chosen by data (scatter and
// gather by index, TopK, Unique, NonZero, Compress, NonMaxSuppression), of signal processing
// (the window functions, DFT, STFT), of Det, and of the training domain's optimizers
// (trace/onnx/onnx_import.h).
#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>

#include "core/ops.h"
#include "trace/onnx/onnx_import.h"

namespace duet::detail::onnx_import {

namespace {

using V = std::vector<Tensor>;

// ---- scatter and gather by index ----

// base with updates written (reduction "none"), added ("add") or taken the larger/smaller of
// ("max"/"min") at index along dim; positions no index names keep base's value.
Tensor scatter_with(const Node& n, const Tensor& base, int64_t dim, const Tensor& index,
                    const Tensor& updates, const std::string& reduction) {
  const Tensor upd = as(updates, base.dtype());
  if (reduction == "add") return scatter_add(base, dim, index, upd);
  Tensor zeros = full(base.sizes(), 0, like(base));
  Tensor hits =
      scatter_add(full(base.sizes(), 0, Options().dtype(DType::i64).device(base.device())), dim,
                  index, full(index.sizes(), 1, Options().dtype(DType::i64).device(base.device())));
  Tensor written = scatter_add(zeros, dim, index, upd);
  if (reduction == "none") return where(gt(hits, 0), written, base);
  if (reduction == "max") return where(gt(hits, 0), maximum(written, base), base);
  if (reduction == "min") return where(gt(hits, 0), minimum(written, base), base);
  n.fail(fmt::format("reduction \"{}\" is not supported (none, add, max, min)", reduction));
}

V op_scatter_elements(const Node& n) {
  const Tensor& x = n.in(0);
  const int64_t a = n.axis(n.attr_i("axis", 0), x.dim());
  return {scatter_with(n, x, a, wrap_index(n.in(1), x.sizes()[a]), n.in(2),
                       n.attr_s("reduction", "none"))};
}

// The flat positions (in data viewed as 1-D) that an ND index tensor (..., k) addresses, each
// the start of a block of `block` elements, followed by that block: shape (..., block).
Tensor nd_positions(const Tensor& data, const Tensor& indices, int64_t batch_dims) {
  const std::vector<int64_t> D = dims_of(data), I = dims_of(indices);
  const int64_t k = I.back(), b = batch_dims;
  const int64_t block = prod(D, static_cast<size_t>(b + k));
  Tensor idx = as(indices, DType::i64);
  Tensor pos = full(Shape(std::vector<int64_t>(I.begin(), I.end() - 1)), 0,
                    Options().dtype(DType::i64).device(data.device()));
  for (int64_t j = 0; j < k; ++j) {
    const int64_t len = D[static_cast<size_t>(b + j)];
    Tensor ij = squeeze(slice(idx, -1, j, j + 1), idx.dim() - 1);
    ij = where(lt(ij, 0), ij + len, ij);
    pos = pos * len + ij;
  }
  if (b > 0) {  // each batch position offsets into its own part of data
    std::vector<int64_t> shape(I.begin(), I.begin() + b);
    shape.resize(I.size() - 1, 1);
    Tensor batch = reshape(
        arange(prod(I, 0, static_cast<size_t>(b)), Options().device(data.device())), Shape(shape));
    pos = pos + batch * prod(D, static_cast<size_t>(b), static_cast<size_t>(b + k));
  }
  Tensor within = arange(block, Options().device(data.device()));
  return unsqueeze(pos, pos.dim()) * block + within;
}

V op_gather_nd(const Node& n) {
  const Tensor &x = n.in(0), &idx = n.in(1);
  const int64_t b = n.attr_i("batch_dims", 0);
  const std::vector<int64_t> D = dims_of(x), I = dims_of(idx);
  Tensor pos = nd_positions(x, idx, b);
  std::vector<int64_t> out(I.begin(), I.end() - 1);
  out.insert(out.end(), D.begin() + b + I.back(), D.end());
  return {reshape(index_select(reshape(x, {-1}), 0, reshape(pos, {-1})), Shape(out))};
}

V op_scatter_nd(const Node& n) {
  const Tensor& x = n.in(0);
  Tensor pos = reshape(nd_positions(x, n.in(1), 0), {-1});
  Tensor flat = scatter_with(n, reshape(x, {-1}), 0, pos, reshape(n.in(2), {-1}),
                             n.attr_s("reduction", "none"));
  return {reshape(flat, x.sizes())};
}

V op_compress(const Node& n) {
  Tensor x = n.in(0);
  std::vector<int64_t> cond = n.ints(1);
  int64_t a = 0;
  if (n.has_attr("axis"))
    a = n.axis(n.attr_i("axis", 0), x.dim());
  else
    x = reshape(x, {-1});
  std::vector<int64_t> keep;
  for (int64_t i = 0; i < std::min<int64_t>(static_cast<int64_t>(cond.size()), x.sizes()[a]); ++i)
    if (cond[static_cast<size_t>(i)]) keep.push_back(i);
  return {index_select(x, a, i64s(keep, x.device()))};
}

V op_reverse_sequence(const Node& n) {
  const Tensor& x = n.in(0);
  const std::vector<int64_t> lens = n.ints(1);
  const int64_t ta = n.axis(n.attr_i("time_axis", 0), x.dim());
  const int64_t ba = n.axis(n.attr_i("batch_axis", 1), x.dim());
  const int64_t T = x.sizes()[ta], B = x.sizes()[ba];
  if (static_cast<int64_t>(lens.size()) != B)
    n.fail(fmt::format("sequence_lens holds {} lengths for a batch of {}", lens.size(), B));
  // src[t][b]: the time step that lands at t in batch b.
  std::vector<int64_t> src(static_cast<size_t>(T * B));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t b = 0; b < B; ++b) {
      const int64_t len = lens.at(static_cast<size_t>(b));
      src[static_cast<size_t>(t * B + b)] = t < len ? len - 1 - t : t;
    }
  std::vector<int64_t> shape(static_cast<size_t>(x.dim()), 1);
  shape[static_cast<size_t>(ta)] = T;
  shape[static_cast<size_t>(ba)] = B;
  Tensor idx = i64s(src, x.device());
  idx = ta < ba ? reshape(idx, Shape(shape))
                : reshape(transpose(reshape(idx, {T, B}), 0, 1), Shape(shape));
  return {gather(x, ta, expand(idx, x.sizes()).contiguous())};
}

// ---- selection and sorting ----

V op_topk(const Node& n) {
  const Tensor& x = n.in(0);
  const int64_t a = n.axis(n.attr_i("axis", -1), x.dim());
  const int64_t k = n.opset() < 10 ? n.attr_i("k", 1) : n.int1(1);
  if (k < 0 || k > x.sizes()[a])
    n.fail(fmt::format("k = {} for a dim of size {}", k, x.sizes()[a]));
  const bool largest = n.attr_i("largest", 1);
  // k rounds of argmax over what is left; ties go to the lower index, as ONNX asks.
  Tensor key = largest ? x : neg(x);
  if (!is_floating(key.dtype())) key = as(key, DType::f64);
  std::vector<int64_t> shape(static_cast<size_t>(x.dim()), 1);
  shape[static_cast<size_t>(a)] = x.sizes()[a];
  Tensor pos = reshape(arange(x.sizes()[a], Options().device(x.device())), Shape(shape));
  std::vector<Tensor> values, indices;
  for (int64_t i = 0; i < k; ++i) {
    Tensor idx = argmax(key, a, true);
    values.push_back(gather(x, a, idx));
    indices.push_back(idx);
    key = where(eq(pos, idx), full({}, -INFINITY, like(key)), key);
  }
  if (k == 0) {
    std::vector<int64_t> s = dims_of(x);
    s[static_cast<size_t>(a)] = 0;
    return {full(Shape(s), 0, like(x)), full(Shape(s), 0, Options().dtype(DType::i64))};
  }
  return {cat(values, a), cat(indices, a)};
}

V op_nonzero(const Node& n) {
  const Tensor& x = n.in(0);
  std::vector<double> v = as(x, DType::f64).to(Device::cpu()).to_vector<double>();
  const std::vector<int64_t> d = dims_of(x);
  std::vector<std::vector<int64_t>> rows(d.size());
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] == 0) continue;
    size_t rest = i;
    for (size_t k = d.size(); k-- > 0;) {
      rows[k].push_back(static_cast<int64_t>(rest % static_cast<size_t>(d[k])));
      rest /= static_cast<size_t>(d[k]);
    }
  }
  std::vector<int64_t> flat;
  for (auto& r : rows) flat.insert(flat.end(), r.begin(), r.end());
  int64_t count = 0;
  for (double e : v) count += e != 0;
  return {reshape(i64s(flat, x.device()), {x.dim(), count})};
}

V op_unique(const Node& n) {
  const Tensor& x0 = n.in(0);
  const bool has_axis = n.has_attr("axis");
  const int64_t a = has_axis ? n.axis(n.attr_i("axis", 0), x0.dim()) : 0;
  Tensor x = has_axis ? x0 : reshape(x0, {-1});
  // The slices along a, as rows of numbers, compared on the host.
  const int64_t len = x.sizes()[a];
  Tensor rows_t = reshape(movedim_first(x, a), {len, -1});
  std::vector<double> v = as(rows_t, DType::f64).to(Device::cpu()).to_vector<double>();
  const int64_t w = len ? static_cast<int64_t>(v.size()) / len : 0;
  auto row = [&](int64_t i) {
    return std::vector<double>(v.begin() + i * w, v.begin() + (i + 1) * w);
  };
  std::vector<int64_t> first;  // first occurrence of each distinct row, in order of appearance
  std::vector<int64_t> inverse(static_cast<size_t>(len));
  std::map<std::vector<double>, int64_t> seen;
  for (int64_t i = 0; i < len; ++i) {
    auto [it, fresh] = seen.emplace(row(i), static_cast<int64_t>(first.size()));
    if (fresh) first.push_back(i);
    inverse[static_cast<size_t>(i)] = it->second;
  }
  std::vector<int64_t> order(first.size());
  std::iota(order.begin(), order.end(), 0);
  if (n.attr_i("sorted", 1))
    std::sort(order.begin(), order.end(),
              [&](int64_t p, int64_t q) { return row(first[p]) < row(first[q]); });
  std::vector<int64_t> rank(order.size()), firsts, counts(order.size(), 0);
  for (size_t r = 0; r < order.size(); ++r) {
    rank[static_cast<size_t>(order[r])] = static_cast<int64_t>(r);
    firsts.push_back(first[static_cast<size_t>(order[r])]);
  }
  for (int64_t& i : inverse) {
    i = rank[static_cast<size_t>(i)];
    ++counts[static_cast<size_t>(i)];
  }
  return {index_select(x, a, i64s(firsts, x.device())), i64s(firsts, x.device()),
          i64s(inverse, x.device()), i64s(counts, x.device())};
}

// ---- windows and linear algebra ----

template <int kind>  // 0 Hann, 1 Hamming, 2 Blackman
V op_window(const Node& n) {
  const int64_t size = static_cast<int64_t>(n.number(0));
  const DType d = dtype_attr(n, "output_datatype", DType::f32);
  check_fits(n, "the window", {static_cast<double>(size)}, DType::f64);
  const double den = static_cast<double>(n.attr_i("periodic", 1) ? size : size - 1);
  Tensor i = arange(size, Options().dtype(DType::f64)) * (2 * M_PI / den);
  Tensor w = kind == 0   ? 0.5 - cos(i) * 0.5
             : kind == 1 ? 25.0 / 46.0 - cos(i) * (21.0 / 46.0)
                         : 0.42 - cos(i) * 0.5 + cos(i * 2) * 0.08;
  return {as(w, d)};
}

// The determinant of the trailing (k, k) matrices, by cofactor expansion along the first row.
Tensor det(const Tensor& x) {
  const int64_t k = x.sizes()[x.dim() - 1], r = x.dim();
  auto at = [&](int64_t i, int64_t j) {
    return squeeze(squeeze(slice(slice(x, r - 2, i, i + 1), r - 1, j, j + 1), r - 1), r - 2);
  };
  if (k == 1) return at(0, 0);
  if (k == 2) return at(0, 0) * at(1, 1) - at(0, 1) * at(1, 0);
  Tensor total;
  for (int64_t j = 0; j < k; ++j) {
    Tensor minor = slice(x, r - 2, 1, k);
    minor = j == 0       ? slice(minor, r - 1, 1, k)
            : j == k - 1 ? slice(minor, r - 1, 0, k - 1)
                         : cat({slice(minor, r - 1, 0, j), slice(minor, r - 1, j + 1, k)}, r - 1);
    Tensor term = at(0, j) * det(minor);
    total = !total.defined() ? term : (j % 2 ? total - term : total + term);
  }
  return total;
}

V op_det(const Node& n) {
  const Tensor& x = n.in(0);
  if (x.dim() < 2 || x.sizes()[x.dim() - 2] != x.sizes()[x.dim() - 1])
    n.fail(fmt::format("shape {} is not square", x.sizes()));
  const int64_t k = x.sizes()[x.dim() - 1];
  if (k > 6)
    n.fail(fmt::format("matrices of {} x {}: duet expands determinants up to 6 x 6", k, k));
  return {det(x)};
}

// ---- detection ----

// Whether box a suppresses box b: their intersection over union exceeds the threshold. Boxes are
// [y1, x1, y2, x2] (corners in either order) or, with center_point_box, [xc, yc, w, h].
bool suppresses(const double* a, const double* b, bool center, double iou_threshold) {
  auto span = [&](const double* q, int lo, int hi, int c, int half) {
    if (center) return std::pair<double, double>{q[c] - q[half] / 2, q[c] + q[half] / 2};
    return std::pair<double, double>{std::min(q[lo], q[hi]), std::max(q[lo], q[hi])};
  };
  auto [ax0, ax1] = span(a, 1, 3, 0, 2);
  auto [bx0, bx1] = span(b, 1, 3, 0, 2);
  auto [ay0, ay1] = span(a, 0, 2, 1, 3);
  auto [by0, by1] = span(b, 0, 2, 1, 3);
  const double iw = std::min(ax1, bx1) - std::max(ax0, bx0);
  const double ih = std::min(ay1, by1) - std::max(ay0, by0);
  if (iw <= 0 || ih <= 0) return false;
  const double inter = iw * ih, area_a = (ax1 - ax0) * (ay1 - ay0),
               area_b = (bx1 - bx0) * (by1 - by0);
  const double uni = area_a + area_b - inter;
  if (area_a <= 0 || area_b <= 0 || uni <= 0) return false;
  return inter / uni > iou_threshold;
}

// Greedy non-maximum suppression per batch and class, on the host: the boxes and scores are
// read (guarded under compile), and the selected (batch, class, box) triples come out as i64.
V op_nms(const Node& n) {
  const Tensor &boxes = n.in(0), &scores = n.in(1);
  const int64_t max_out = n.has(2) && n.in(2).numel() ? std::max<int64_t>(n.int1(2), 0) : 0;
  const double iou = n.has(3) && n.in(3).numel() ? n.number(3) : 0;
  const bool thresholded = n.has(4) && n.in(4).numel();
  const double min_score = thresholded ? n.number(4) : 0;
  const bool center = n.attr_i("center_point_box", 0);
  const std::vector<double> b = as(boxes, DType::f64).to(Device::cpu()).to_vector<double>();
  const std::vector<double> sc = as(scores, DType::f64).to(Device::cpu()).to_vector<double>();
  const int64_t B = scores.sizes()[0], C = scores.sizes()[1], N = scores.sizes()[2];
  std::vector<int64_t> out;
  for (int64_t bi = 0; bi < B; ++bi)
    for (int64_t c = 0; c < C; ++c) {
      const double* s = sc.data() + (bi * C + c) * N;
      std::vector<int64_t> order;
      for (int64_t i = 0; i < N; ++i)
        if (!thresholded || s[i] > min_score) order.push_back(i);
      std::stable_sort(order.begin(), order.end(),
                       [&](int64_t p, int64_t q) { return s[p] > s[q]; });
      std::vector<int64_t> kept;
      for (int64_t i : order) {
        if (static_cast<int64_t>(kept.size()) >= max_out) break;
        bool ok = true;
        for (int64_t k : kept)
          ok = ok && !suppresses(&b[static_cast<size_t>((bi * N + i) * 4)],
                                 &b[static_cast<size_t>((bi * N + k) * 4)], center, iou);
        if (!ok) continue;
        kept.push_back(i);
        out.insert(out.end(), {bi, c, i});
      }
    }
  return {reshape(i64s(out, boxes.device()), {static_cast<int64_t>(out.size() / 3), 3})};
}

// ---- Fourier transforms ----

// The DFT of x (..., n, 2) along `axis` (real and imaginary parts last), as products with the
// cosine and sine matrices: X_k = sum_j x_j e^(-+2 pi i jk/n) for the first `out` bins.
Tensor dft_along(const Tensor& x, int64_t axis, int64_t length, int64_t out, bool inverse) {
  const int64_t n = x.sizes()[axis];
  Tensor j = reshape(arange(length, Options().dtype(DType::f64)), {1, length});
  Tensor k = reshape(arange(out, Options().dtype(DType::f64)), {out, 1});
  Tensor angle = k * j * (2 * M_PI / static_cast<double>(length));
  const double sign = inverse ? 1 : -1;
  Tensor cosm = as(cos(angle), x.dtype()), sinm = as(sin(angle) * sign, x.dtype());
  // Zero-pad or crop the signal to `length`.
  Tensor sig = x;
  if (n > length) sig = slice(sig, axis, 0, length);
  if (n < length) {
    std::vector<int64_t> pads(static_cast<size_t>(2 * sig.dim()), 0);
    pads[static_cast<size_t>(axis + sig.dim())] = length - n;
    std::vector<int64_t> shape = dims_of(sig);
    shape[static_cast<size_t>(axis)] = length - n;
    sig = cat({sig, full(Shape(shape), 0, like(sig))}, axis);
  }
  Tensor re = squeeze(slice(sig, -1, 0, 1), sig.dim() - 1);
  Tensor im = squeeze(slice(sig, -1, 1, 2), sig.dim() - 1);
  const int64_t a = axis;
  auto apply = [&](const Tensor& m, const Tensor& v) {  // m (out, length) along axis a of v
    return movedim_back(matmul(movedim_last(v, a), transpose(m, 0, 1)), a);
  };
  Tensor ore = apply(cosm, re) - apply(sinm, im);
  Tensor oim = apply(sinm, re) + apply(cosm, im);
  Tensor r = stack({ore, oim}, -1);
  return inverse ? r / static_cast<double>(length) : r;
}

V op_dft(const Node& n) {
  Tensor x = n.in(0);
  const int64_t rank = x.dim();
  int64_t axis = n.opset() < 20 ? n.attr_i("axis", 1) : (n.has(2) ? n.int1(2) : -2);
  if (axis < 0) axis += rank;
  if (axis < 0 || axis >= rank - 1)
    n.fail(fmt::format("axis {} for a signal of rank {}", axis, rank));
  if (x.sizes()[rank - 1] == 1) x = cat({x, full(x.sizes(), 0, like(x))}, -1);  // real input
  const int64_t length = n.has(1) && n.in(1).numel() ? n.int1(1) : x.sizes()[axis];
  const bool onesided = n.attr_i("onesided", 0), inverse = n.attr_i("inverse", 0);
  const int64_t out = onesided ? length / 2 + 1 : length;
  check_fits(n, "the DFT's matrix", {static_cast<double>(out), static_cast<double>(length)},
             DType::f64);
  return {dft_along(x, axis, length, out, inverse)};
}

V op_stft(const Node& n) {
  Tensor x = n.in(0);  // (batch, length, 1 or 2)
  const int64_t step = n.int1(1);
  const bool has_window = n.has(2) && n.in(2).numel();
  int64_t frame = has_window ? n.in(2).sizes()[0] : 0;
  if (n.has(3) && n.in(3).numel()) frame = n.int1(3);
  if (frame <= 0) n.fail("needs a window or a frame_length");
  if (frame > x.sizes()[1])
    n.fail(fmt::format("a frame of {} for a signal of length {}", frame, x.sizes()[1]));
  if (x.sizes()[2] == 1) x = cat({x, full(x.sizes(), 0, like(x))}, -1);
  const int64_t frames = (x.sizes()[1] - frame) / step + 1;
  const bool onesided = n.attr_i("onesided", 1);
  std::vector<Tensor> parts;
  for (int64_t f = 0; f < frames; ++f) {
    Tensor seg = slice(x, 1, f * step, f * step + frame);
    if (has_window) seg = seg * reshape(as(n.in(2), x.dtype()), {1, frame, 1});
    parts.push_back(dft_along(seg, 1, frame, onesided ? frame / 2 + 1 : frame, false));
  }
  return {stack(parts, 1)};
}

// ---- the training domain's optimizers (ai.onnx.preview.training) ----

// Inputs R (learning rate), T (update count), then n tensors X, n gradients G and n of each
// state; outputs the n new X, then the n new values of each state.
struct OptimizerIo {
  double lr = 0;
  int64_t t = 0;
  size_t count = 0;
  Tensor x(const Node& n, size_t i) const { return n.in(2 + i); }
  Tensor g(const Node& n, size_t i) const { return n.in(2 + count + i); }
  Tensor state(const Node& n, size_t which, size_t i) const {
    return n.in(2 + (2 + which) * count + i);
  }
};

OptimizerIo optimizer_io(const Node& n, size_t states) {
  OptimizerIo o;
  o.lr = n.number(0);
  o.t = static_cast<int64_t>(n.number(1));
  if ((n.size() - 2) % (2 + states)) n.fail("the inputs do not split into X, G and the states");
  o.count = (n.size() - 2) / (2 + states);
  return o;
}

V op_adagrad(const Node& n) {
  const OptimizerIo io = optimizer_io(n, 1);
  const double r = io.lr / (1 + static_cast<double>(io.t) * n.attr_f("decay_factor", 0));
  const double eps = n.attr_f("epsilon", 0), norm = n.attr_f("norm_coefficient", 0);
  V xs, hs;
  for (size_t i = 0; i < io.count; ++i) {
    Tensor x = io.x(n, i), g = io.g(n, i) + x * norm;
    Tensor h = io.state(n, 0, i) + g * g;
    xs.push_back(x - g * r / (sqrt(h) + eps));
    hs.push_back(h);
  }
  xs.insert(xs.end(), hs.begin(), hs.end());
  return xs;
}

V op_momentum(const Node& n) {
  const OptimizerIo io = optimizer_io(n, 1);
  const double alpha = n.attr_f("alpha", 0), beta = io.t > 0 ? n.attr_f("beta", 0) : 1;
  const double norm = n.attr_f("norm_coefficient", 0);
  const bool nesterov = n.attr_s("mode", "standard") == "nesterov";
  V xs, vs;
  for (size_t i = 0; i < io.count; ++i) {
    Tensor x = io.x(n, i), g = io.g(n, i) + x * norm;
    Tensor v = io.state(n, 0, i) * alpha + g * beta;
    xs.push_back(nesterov ? x - (g + v * alpha) * io.lr : x - v * io.lr);
    vs.push_back(v);
  }
  xs.insert(xs.end(), vs.begin(), vs.end());
  return xs;
}

V op_adam(const Node& n) {
  const OptimizerIo io = optimizer_io(n, 2);
  const double alpha = n.attr_f("alpha", 0.9), beta = n.attr_f("beta", 0.999);
  const double eps = n.attr_f("epsilon", 1e-6), norm = n.attr_f("norm_coefficient", 0);
  const double post = n.attr_f("norm_coefficient_post", 0);
  const double t = static_cast<double>(io.t);
  const double r =
      io.t > 0 ? io.lr * std::sqrt(1 - std::pow(beta, t)) / (1 - std::pow(alpha, t)) : io.lr;
  V xs, vs, hs;
  for (size_t i = 0; i < io.count; ++i) {
    Tensor x = io.x(n, i), g = io.g(n, i) + x * norm;
    Tensor v = io.state(n, 0, i) * alpha + g * (1 - alpha);
    Tensor h = io.state(n, 1, i) * beta + g * g * (1 - beta);
    xs.push_back((x - v / (sqrt(h) + eps) * r) * (1 - post));
    vs.push_back(v);
    hs.push_back(h);
  }
  xs.insert(xs.end(), vs.begin(), vs.end());
  xs.insert(xs.end(), hs.begin(), hs.end());
  return xs;
}

}  // namespace

std::vector<OpEntry> data_ops() {
  return {
      {"ScatterElements", op_scatter_elements},
      {"Scatter", op_scatter_elements},
      {"GatherND", op_gather_nd},
      {"ScatterND", op_scatter_nd},
      {"Compress", op_compress},
      {"ReverseSequence", op_reverse_sequence},
      {"TopK", op_topk},
      {"NonZero", op_nonzero},
      {"Unique", op_unique},
      {"HannWindow", op_window<0>},
      {"HammingWindow", op_window<1>},
      {"BlackmanWindow", op_window<2>},
      {"Det", op_det},
      {"NonMaxSuppression", op_nms},
      {"DFT", op_dft},
      {"STFT", op_stft},
      {"ai.onnx.preview.training.Adagrad", op_adagrad},
      {"ai.onnx.preview.training.Adam", op_adam},
      {"ai.onnx.preview.training.Momentum", op_momentum},
  };
}

}  // namespace duet::detail::onnx_import
