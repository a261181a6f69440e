// Float64 references for matmul and the reductions, on row-major doubles (see op_rows.h).
#include <algorithm>
#include <cmath>

#include "op_rows.h"

namespace duet::test {

std::vector<double> ref_matmul(const std::vector<double>& a, const Shape& as,
                               const std::vector<double>& b, const Shape& bs, Shape* out) {
  // torch.matmul: a 1-D left operand is a row, a 1-D right operand a column; the added dims are
  // dropped from the result. Batch dims broadcast.
  Shape a2 = as, b2 = bs;
  if (as.size() == 1) a2.insert(0, 1);
  if (bs.size() == 1) b2.push_back(1);
  const int64_t m = a2[a2.size() - 2], k = a2[a2.size() - 1], n = b2[b2.size() - 1];
  Shape ba(a2.data(), a2.size() - 2), bb(b2.data(), b2.size() - 2);
  const Shape batch = broadcast_shape(ba, bb);
  // Expand each operand's batch to the common batch, then multiply matrix by matrix.
  Shape afull = batch, bfull = batch;
  afull.push_back(m), afull.push_back(k);
  bfull.push_back(k), bfull.push_back(n);
  std::vector<double> ae = broadcast_values(a, a2, afull), be = broadcast_values(b, b2, bfull);
  const int64_t count = batch.numel();
  std::vector<double> r(static_cast<size_t>(count * m * n), 0.0);
  for (int64_t t = 0; t < count; ++t)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t p = 0; p < k; ++p) s += ae[t * m * k + i * k + p] * be[t * k * n + p * n + j];
        r[t * m * n + i * n + j] = s;
      }
  *out = batch;
  if (as.size() > 1) out->push_back(m);
  if (bs.size() > 1) out->push_back(n);
  return r;
}

std::vector<double> ref_reduce(ReduceKind kind, const std::vector<double>& x, const Shape& s,
                               const std::vector<int64_t>& dims, bool keepdim, Shape* out) {
  const int64_t nd = s.size();
  std::vector<char> red(static_cast<size_t>(nd), dims.empty());
  for (int64_t d : dims) red[d] = true;
  // The step in the output of one step along each input dim (0 on reduced dims).
  std::vector<int64_t> sizes(s.begin(), s.end()), ostep(static_cast<size_t>(nd));
  int64_t nout = 1;
  for (int64_t d = nd - 1; d >= 0; --d) {
    ostep[d] = red[d] ? 0 : nout;
    if (!red[d]) nout *= sizes[d];
  }
  std::vector<double> acc(static_cast<size_t>(nout));
  std::vector<int64_t> cnt(static_cast<size_t>(nout), 0), idx(static_cast<size_t>(nd), 0);
  // Row-major over x, the output offset o stepped like an odometer alongside.
  int64_t o = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double v = x[i];
    double& a = acc[o];
    if (cnt[o]++ == 0) {
      a = v;
    } else if (kind == ReduceKind::Max) {
      a = std::isnan(a) || std::isnan(v) ? NAN : std::max(a, v);
    } else if (kind == ReduceKind::Min) {
      a = std::isnan(a) || std::isnan(v) ? NAN : std::min(a, v);
    } else {
      a += v;
    }
    for (int64_t d = nd - 1; d >= 0; --d) {
      o += ostep[d];
      if (++idx[d] < sizes[d]) break;
      o -= ostep[d] * sizes[d];
      idx[d] = 0;
    }
  }
  for (int64_t k = 0; k < nout; ++k) {
    if (kind == ReduceKind::Mean) acc[k] = cnt[k] ? acc[k] / cnt[k] : NAN;
    if (kind == ReduceKind::Sum && cnt[k] == 0) acc[k] = 0;
  }
  *out = reduced_shape(s, dims, keepdim);
  return acc;
}

Shape reduced_shape(const Shape& s, const std::vector<int64_t>& dims, bool keepdim) {
  Shape out;
  for (int64_t d = 0; d < s.size(); ++d) {
    const bool red = dims.empty() || std::find(dims.begin(), dims.end(), d) != dims.end();
    if (!red)
      out.push_back(s[d]);
    else if (keepdim)
      out.push_back(1);
  }
  return out;
}

std::vector<double> ref_slice_scatter(const std::vector<double>& base, const Shape& bs,
                                      const std::vector<double>& src, const ScatterRow& row) {
  const int64_t nd = bs.size(), dim = row.dim < 0 ? row.dim + nd : row.dim, n = bs[dim];
  int64_t start = row.start < 0 ? row.start + n : row.start;
  int64_t end = row.end < 0 ? row.end + n : row.end;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  // Walk the base row-major; an element whose index along dim is start + j * step (j >= 0,
  // below end) takes src's element with index j there.
  std::vector<double> out = base;
  int64_t inner = 1;
  for (int64_t d = dim + 1; d < nd; ++d) inner *= bs[d];
  const int64_t taken = row.src[dim];
  for (int64_t i = 0; i < bs.numel(); ++i) {
    const int64_t outer = i / (inner * n), k = (i / inner) % n, r = i % inner;
    if (k < start || k >= end || (k - start) % row.step != 0) continue;
    const int64_t j = (k - start) / row.step;
    out[static_cast<size_t>(i)] = src[static_cast<size_t>((outer * taken + j) * inner + r)];
  }
  return out;
}

}  // namespace duet::test
