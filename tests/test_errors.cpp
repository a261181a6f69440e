// Error rows: bad inputs for every op family. Each must throw duet::Error of the expected kind
// (ShapeError, DTypeError, ValueError) with a message that starts with "[op]".
#include <cmath>
#include <functional>

#include "util.h"

namespace duet::test {
namespace {

enum class Kind { Any, Shape, DType, Value };

struct ErrorRow {
  const char* family;
  std::function<void()> call;
  Kind kind;
  const char* prefix;  ///< the message starts with this ("[op]" at least)
};

Tensor f32(Shape s) { return zeros(s); }
Tensor of(Shape s, DType d) { return zeros(s, Options().dtype(d)); }
Tensor i64s(std::vector<double> v) { return tensor(v, Options().dtype(DType::i64)); }

const std::vector<ErrorRow>& error_rows() {
  using D = DType;
  static const std::vector<ErrorRow> rows = {
      // Elementwise with broadcasting.
      {"elementwise", [] { f32({3}) + f32({4}); }, Kind::Shape,
       "[add] shapes (3) and (4) cannot broadcast"},
      {"elementwise",
       [] {
         add(f32({2, 3}), f32({3, 2}));
       },
       Kind::Shape, "[add]"},
      {"elementwise",
       [] {
         f32({2, 3}) * f32({3, 2});
       },
       Kind::Shape, "[mul] shapes (2, 3) and (3, 2) cannot broadcast"},
      {"elementwise",
       [] {
         div(f32({5}), f32({2, 4}));
       },
       Kind::Shape, "[div]"},
      {"elementwise", [] { maximum(f32({2}), f32({3})); }, Kind::Shape, "[maximum]"},
      {"elementwise", [] { minimum(std::move(f32({2})), f32({3})); }, Kind::Shape, "[minimum]"},
      {"elementwise", [] { of({2}, D::b8) - of({2}, D::b8); }, Kind::DType,
       "[sub] subtraction of b8 tensors"},
      {"elementwise", [] { of({2}, D::b8) - true; }, Kind::DType, "[sub]"},
      {"elementwise", [] { pow(of({2}, D::b8), of({2}, D::b8)); }, Kind::DType, "[pow]"},
      {"elementwise", [] { neg(of({2}, D::b8)); }, Kind::DType,
       "[neg] is not defined for b8 tensors of shape (2)"},
      {"elementwise", [] { abs(of({}, D::b8)); }, Kind::DType, "[abs]"},
      {"elementwise", [] { relu(of({2}, D::b8)); }, Kind::DType, "[relu]"},
      {"elementwise", [] { -of({2}, D::b8); }, Kind::DType, "[neg]"},
      // Comparisons and where.
      {"compare/where", [] { f32({3}) < f32({4}); }, Kind::Shape, "[lt] shapes (3) and (4)"},
      {"compare/where",
       [] {
         eq(f32({2, 3}), f32({3, 2}));
       },
       Kind::Shape, "[eq]"},
      {"compare/where", [] { f32({2}) != f32({0}); }, Kind::Shape, "[ne]"},
      {"compare/where", [] { where(f32({2}), f32({2}), f32({2})); }, Kind::DType,
       "[where] condition must be b8, got f32 of shape (2)"},
      {"compare/where", [] { where(of({2}, D::i64), 1, f32({2})); }, Kind::DType, "[where]"},
      {"compare/where", [] { where(of({3}, D::b8), f32({4}), f32({3})); }, Kind::Shape,
       "[where] shapes (3) and (4) cannot broadcast"},
      {"compare/where",
       [] {
         where(of({3}, D::b8), f32({3}), f32({2, 2}));
       },
       Kind::Shape, "[where]"},
      // Reductions.
      {"reduction",
       [] {
         max(f32({2, 0}), 1);
       },
       Kind::Value, "[max] cannot reduce over dim 1 of size 0"},
      {"reduction", [] { min(f32({0})); }, Kind::Value, "[min]"},
      {"reduction",
       [] {
         max(f32({0, 3}));
       },
       Kind::Value, "[max]"},
      {"reduction",
       [] {
         sum(f32({2, 3}), 2);
       },
       Kind::Value, "[sum] dim 2 is out of range for a tensor of rank 2"},
      {"reduction",
       [] {
         sum(f32({2, 3}), -3);
       },
       Kind::Value, "[sum]"},
      {"reduction",
       [] {
         sum(f32({2, 3}), {0, -2});
       },
       Kind::Value, "[sum] dim 0 appears more than once"},
      {"reduction",
       [] {
         max(f32({2, 3}), {1, 1});
       },
       Kind::Value, "[max]"},
      {"reduction", [] { mean(of({2}, D::i64)); }, Kind::DType, "[mean] needs a floating input"},
      {"reduction",
       [] {
         mean(f32({2, 3}), 5);
       },
       Kind::Value, "[mean]"},
      {"reduction", [] { min(f32({}), 1); }, Kind::Value, "[min]"},
      // Matmul.
      {"matmul",
       [] {
         matmul(f32({2, 3}), f32({4, 5}));
       },
       Kind::Shape, "[matmul] inner dimensions differ: (2, 3) @ (4, 5)"},
      {"matmul", [] { matmul(f32({3}), f32({4})); }, Kind::Shape, "[matmul]"},
      {"matmul",
       [] {
         matmul(f32({2, 3}), f32({4}));
       },
       Kind::Shape, "[matmul]"},
      {"matmul",
       [] {
         matmul(f32({2, 3, 4}), f32({3, 4, 5}));
       },
       Kind::Shape, "[matmul]"},
      {"matmul", [] { matmul(f32({}), f32({3})); }, Kind::Shape, "[matmul]"},
      {"matmul",
       [] {
         matmul(of({2, 2}, D::b8), of({2, 2}, D::b8));
       },
       Kind::DType, "[matmul] is not defined for b8"},
      // addmv (Note [addmv] in core/ops/linalg.cpp): the op and its composite.
      {"matmul",
       [] {
         addmv(f32({3}), f32({3, 4}), f32({5}));
       },
       Kind::Shape, "[addmv] needs input (n), mat (n, k) and vec (k), got (3), (3, 4) and (5)"},
      {"matmul", [] { addmv(f32({3}), f32({3}), f32({3})); }, Kind::Shape,
       "[addmv] needs mat (n, k) and vec (k), got (3) and (3)"},
      {"matmul",
       [] {
         addmv(f32({2}), f32({3, 4}), f32({4}));
       },
       Kind::Shape, "[addmv] input (2) does not broadcast to (3)"},
      {"matmul",
       [] {
         addmv(f32({3}), f32({3, 4}), of({4}, D::f64));
       },
       Kind::DType,
       "[addmv] input, mat and vec must share a dtype other than b8, got f32, f32 and f64"},
      {"matmul",
       [] {
         addmv(Tensor(), f32({3, 4}), f32({4}));
       },
       Kind::Value, "[addmv] input, mat and vec must be defined tensors"},
      // addmm (Note [addmm] in core/ops/linalg.cpp): the op and its composite.
      {"matmul",
       [] {
         addmm(f32({3}), f32({2, 4}), f32({5, 3}));
       },
       Kind::Shape,
       "[addmm] needs input (n), mat1 (m, k) and mat2 (k, n), got (3), (2, 4) and (5, 3)"},
      {"matmul",
       [] {
         addmm(f32({3}), f32({2}), f32({2, 3}));
       },
       Kind::Shape, "[addmm] needs mat1 (m, k) and mat2 (k, n), got (2) and (2, 3)"},
      {"matmul",
       [] {
         addmm(f32({3, 3}), f32({2, 4}), f32({4, 3}));
       },
       Kind::Shape, "[addmm] input (3, 3) does not broadcast to (2, 3)"},
      {"matmul",
       [] {
         addmm(of({3}, D::f64), f32({2, 4}), f32({4, 3}));
       },
       Kind::DType,
       "[addmm] input, mat1 and mat2 must share a dtype other than b8, got f64, f32 and f32"},
      {"matmul",
       [] {
         addmm(f32({3}), f32({2, 4}), Tensor());
       },
       Kind::Value, "[addmm] input, mat1 and mat2 must be defined tensors"},
      {"matmul",
       [] {
         matmul(f32({2, 2}), of({2, 2}, D::f64));
       },
       Kind::DType, "[matmul] operands must have the same dtype"},
      {"matmul", [] { matmul(of({2}, D::i64), f32({2})); }, Kind::DType, "[matmul]"},
      // Views.
      {"view",
       [] {
         reshape(f32({2, 3}), {4});
       },
       Kind::Shape, "[reshape] cannot reshape a tensor of shape (2, 3) (6 elements) to (4)"},
      {"view",
       [] {
         reshape(f32({2, 3}), {-1, -1});
       },
       Kind::Shape, "[reshape] only one dim may be -1"},
      {"view",
       [] {
         reshape(f32({2, 3}), {4, -1});
       },
       Kind::Shape, "[reshape]"},
      {"view",
       [] {
         reshape(f32({0, 3}), {0, -1});
       },
       Kind::Shape, "[reshape]"},
      {"view",
       [] {
         reshape(f32({2, 3}), {-2, -3});
       },
       Kind::Shape, "[reshape] invalid size -2"},
      {"view",
       [] {
         permute(f32({2, 3}), {0, 0});
       },
       Kind::Value, "[permute] order must be a permutation"},
      {"view",
       [] {
         permute(f32({2, 3}), {0});
       },
       Kind::Value, "[permute]"},
      {"view",
       [] {
         permute(f32({2, 3}), {0, 2});
       },
       Kind::Value, "[permute]"},
      {"view", [] { slice(f32({4}), 0, 0, 4, 0); }, Kind::Value,
       "[slice] step must be positive, got 0"},
      {"view", [] { slice(f32({4}), 0, 0, 4, -1); }, Kind::Value, "[slice]"},
      {"view", [] { slice(f32({}), 0, 0, 1); }, Kind::Value, "[slice] cannot slice a 0-d tensor"},
      {"view", [] { slice(f32({4}), 1, 0, 1); }, Kind::Value, "[slice]"},
      // slice_scatter: the source must fit the slice exactly, in the base's dtype.
      {"view",
       [] {
         slice_scatter(f32({4, 3}), f32({3, 3}), 0, 1, 3);
       },
       Kind::Shape, "[slice_scatter] source of shape (3, 3) does not fit the slice 1:3:1 of dim 0"},
      {"view",
       [] {
         slice_scatter(f32({4, 3}), f32({2}), 0, 1, 3);
       },
       Kind::Shape, "[slice_scatter]"},
      {"view",
       [] {
         slice_scatter(f32({2, 5}), f32({2, 5}), 1, 0, 5, 2);
       },
       Kind::Shape, "[slice_scatter] source of shape (2, 5)"},
      {"view", [] { slice_scatter(f32({4}), of({2}, D::i64), 0, 0, 2); }, Kind::DType,
       "[slice_scatter] base and source must share a dtype, got f32 and i64"},
      {"view", [] { slice_scatter(f32({}), f32({}), 0, 0, 1); }, Kind::Value,
       "[slice_scatter] cannot slice a 0-d tensor"},
      {"view", [] { slice_scatter(f32({4}), f32({4}), 0, 0, 4, 0); }, Kind::Value,
       "[slice_scatter] step must be positive, got 0"},
      {"view", [] { slice_scatter(f32({4}), f32({4}), 1, 0, 4); }, Kind::Value, "[slice_scatter]"},
      {"view", [] { expand(f32({3}), {4}); }, Kind::Shape,
       "[expand] cannot expand shape (3) to (4)"},
      {"view",
       [] {
         expand(f32({2, 3}), {3});
       },
       Kind::Shape, "[expand]"},
      {"view",
       [] {
         expand(f32({3}), {-1, 3});
       },
       Kind::Shape, "[expand]"},
      {"view", [] { expand(f32({1}), {-2}); }, Kind::Shape, "[expand]"},
      {"view",
       [] {
         expand(f32({1}), {2, -3, 1});
       },
       Kind::Shape, "[expand]"},
      {"view",
       [] {
         transpose(f32({2, 3}), 0, 2);
       },
       Kind::Value, "[transpose]"},
      {"view",
       [] {
         squeeze(f32({2, 1}), -3);
       },
       Kind::Value, "[squeeze]"},
      {"view", [] { unsqueeze(f32({2}), 2); }, Kind::Value, "[unsqueeze]"},
      // Creation.
      {"creation",
       [] {
         tensor({1, 2, 3}, {2, 2});
       },
       Kind::Shape, "[tensor] 3 values do not fill shape (2, 2) (4 elements)"},
      {"creation", [] { arange(-1); }, Kind::Value, "[arange] length must be non-negative"},
      {"creation", [] { tensor({70000}, {}, Options().dtype(DType::f16)); }, Kind::Value,
       "[tensor] value 70000 does not fit in f16"},
      {"creation", [] { full({2}, 1e39, Options().dtype(DType::bf16)); }, Kind::Value,
       "[full] value 1e+39 does not fit in bf16"},
      {"creation", [] { arange(3, Options().dtype(DType::b8)); }, Kind::DType, "[arange]"},
      {"creation",
       [] {
         full({2, -1}, 1.0);
       },
       Kind::Value, "[full] negative size -1"},
      {"creation", [] { eye(-2); }, Kind::Value, "[eye]"},
      {"creation", [] { ones({2}, Options().dtype(DType::i64).requires_grad()); }, Kind::DType,
       "[requires_grad_] only floating tensors can require gradients"},
      // Indexing. Index values are data, checked by the gather and scatter_add kernels, so the
      // composites' out-of-range errors name the primitive.
      {"index",
       [] {
         gather(f32({3, 4}), 0, of({2, 4}, D::i32));
       },
       Kind::DType, "[gather] index must be i64, got i32 of shape (2, 4)"},
      {"index",
       [] {
         gather(f32({3, 4}), 0, of({4}, D::i64));
       },
       Kind::Shape, "[gather] index of shape (4) must have the rank of the input (3, 4)"},
      {"index",
       [] {
         gather(f32({2, 2}), 0, of({3, 3}, D::i64));
       },
       Kind::Shape, "[gather] index of shape (3, 3) is larger than the input (2, 2) in dim 1"},
      {"index",
       [] {
         gather(f32({3, 4}), 1, reshape(i64s({0, 4}), {2, 1}));
       },
       Kind::Value, "[gather] index 4 is out of range for dim 1 of size 4"},
      {"index", [] { gather(f32({3}), 0, i64s({-1})); }, Kind::Value, "[gather] index -1"},
      {"index",
       [] {
         gather(f32({3, 4}), 2, of({3, 4}, D::i64));
       },
       Kind::Value, "[gather] dim 2 is out of range"},
      {"index", [] { scatter_add(f32({3}), 0, of({2}, D::i32), f32({2})); }, Kind::DType,
       "[scatter_add] index must be i64"},
      {"index", [] { scatter_add(f32({3}), 0, of({2}, D::i64), f32({3})); }, Kind::Shape,
       "[scatter_add] index (2) and source (3) must have one shape"},
      {"index", [] { scatter_add(f32({3}), 0, of({2}, D::i64), of({2}, D::f64)); }, Kind::DType,
       "[scatter_add] source dtype f64 differs from the base's f32"},
      {"index", [] { scatter_add(f32({3}), 0, i64s({3}), f32({1})); }, Kind::Value,
       "[scatter_add] index 3 is out of range for dim 0 of size 3"},
      {"index",
       [] {
         index_select(f32({3, 4}), 0, of({2, 2}, D::i64));
       },
       Kind::Shape, "[index_select] index must be 1-D, got shape (2, 2)"},
      {"index", [] { index_select(f32({3}), 0, of({2}, D::i32)); }, Kind::DType,
       "[index_select] index must be i64"},
      {"index", [] { index_select(f32({}), 0, of({1}, D::i64)); }, Kind::Shape,
       "[index_select] input must have at least one dim"},
      {"index",
       [] {
         index_select(f32({3, 4}), 0, i64s({1, 3}));
       },
       Kind::Value, "[index_select] index 3 is out of range for dim 0 of size 3 (from gather)"},
      {"index", [] { embedding(f32({4}), of({2}, D::i64)); }, Kind::Shape,
       "[embedding] weight must be (num_embeddings, dim), got (4)"},
      {"index",
       [] {
         embedding(f32({4, 2}), of({2}, D::f32));
       },
       Kind::DType, "[embedding] indices must be i64, got f32"},
      {"index",
       [] {
         embedding(f32({4, 2}), i64s({4}));
       },
       Kind::Value, "[embedding] index 4 is out of range for dim 0 of size 4 (from gather)"},
      {"index", [] { argmax(of({3}, D::b8), 0); }, Kind::DType, "[argmax] is not defined for b8"},
      {"index",
       [] {
         argmax(f32({2, 0}), 1);
       },
       Kind::Value, "[argmax] cannot reduce over dim 1 of size 0"},
      {"index",
       [] {
         argmax(f32({2, 3}), 2);
       },
       Kind::Value, "[argmax] dim 2 is out of range"},
      {"index", [] { argmin(of({3}, D::b8), 0); }, Kind::DType, "[argmin] is not defined for b8"},
      {"index", [] { argmin(f32({0}), 0); }, Kind::Value,
       "[argmin] cannot reduce over dim 0 of size 0"},
      {"index",
       [] {
         argmin(f32({2, 3}), -3);
       },
       Kind::Value, "[argmin] dim -3 is out of range"},
      // Joining.
      {"join", [] { cat({}); }, Kind::Value, "[cat] needs at least one tensor"},
      {"join",
       [] {
         cat({f32({2, 3}), f32({2, 4})}, 0);
       },
       Kind::Shape,
       "[cat] tensor 1 has shape (2, 4) but tensor 0 has (2, 3): they may differ only in dim 0"},
      {"join",
       [] {
         cat({f32({2, 3}), f32({3})});
       },
       Kind::Shape, "[cat] tensor 1 has shape (3), of another rank than tensor 0's (2, 3)"},
      {"join",
       [] {
         cat({f32({}), f32({})});
       },
       Kind::Shape, "[cat] cannot join 0-d tensors"},
      {"join", [] { cat({f32({2})}, 1); }, Kind::Value, "[cat] dim 1 is out of range"},
      {"join",
       [] {
         stack({f32({2}), f32({3})});
       },
       Kind::Shape, "[stack] tensor 1 has shape (3) but tensor 0 has (2)"},
      {"join", [] { stack({}); }, Kind::Value, "[stack] needs at least one tensor"},
      {"join", [] { stack({f32({2})}, 2); }, Kind::Value, "[stack] dim 2 is out of range"},
      // Images.
      {"image",
       [] {
         conv2d(f32({1, 2, 5, 5}), f32({3, 3, 3, 3}));
       },
       Kind::Shape, "[conv2d] input has 2 channels but the weight (3, 3, 3, 3) expects 3"},
      {"image",
       [] {
         conv2d(f32({2, 5, 5}), f32({3, 2, 3, 3}));
       },
       Kind::Shape, "[conv2d] input must be (N, C, H, W), got (2, 5, 5)"},
      {"image",
       [] {
         conv2d(f32({1, 2, 5, 5}), f32({3, 2, 3}));
       },
       Kind::Shape, "[conv2d] weight must be (out, in / groups, kh, kw), got (3, 2, 3)"},
      {"image",
       [] {
         conv2d(f32({1, 4, 5, 5}), f32({2, 2, 3, 3}), {}, 1, 0, 3);
       },
       Kind::Shape,
       "[conv2d] input has 4 channels but the weight (2, 2, 3, 3) in 3 groups expects 6"},
      {"image",
       [] {
         conv2d(f32({1, 4, 5, 5}), f32({3, 2, 3, 3}), {}, 1, 0, 2);
       },
       Kind::Shape, "[conv2d] 4 input and 3 output channels do not split into 2 groups"},
      {"image",
       [] {
         conv2d(f32({1, 4, 5, 5}), f32({2, 2, 3, 3}), {}, 1, 0, 0);
       },
       Kind::Value, "[conv2d] groups must be positive, got 0"},
      {"image",
       [] {
         conv2d(f32({1, 1, 2, 2}), f32({1, 1, 3, 3}));
       },
       Kind::Shape, "[conv2d] kernel 3x3 is larger than the padded input 2x2"},
      {"image",
       [] {
         conv2d(f32({1, 1, 4, 4}), f32({1, 1, 3, 3}), f32({2}));
       },
       Kind::Shape, "[conv2d] bias must be (1), got (2)"},
      {"image",
       [] {
         conv2d(f32({1, 1, 4, 4}), f32({1, 1, 3, 3}), {}, 0);
       },
       Kind::Value, "[conv2d] kernel 3x3 and stride 0x0 must be positive"},
      {"image",
       [] {
         conv2d(f32({1, 1, 4, 4}), f32({1, 1, 3, 3}), {}, 1, -1);
       },
       Kind::Value, "[conv2d]"},
      {"image",
       [] {
         conv2d(f32({1, 1, 4, 4}), f32({1, 1, 3, 3}), {}, 1, 0, 1, {1, 0});
       },
       Kind::Value, "[conv2d] dilation 1x0 must be positive"},
      {"image",
       [] {
         conv2d(f32({1, 1, 4, 5}), f32({1, 1, 3, 3}), {}, 1, 0, 1, 2);
       },
       Kind::Shape, "[conv2d] kernel 3x3 dilated by 2x2 is larger than the padded input 4x5"},
      {"image",
       [] {
         unfold(f32({1, 1, 4, 4}), 2, 1, 0, -1);
       },
       Kind::Value, "[unfold] dilation -1x-1 must be positive"},
      {"image",
       [] {
         conv2d(f32({1, 1, 4, 4}), of({1, 1, 3, 3}, D::f64));
       },
       Kind::DType, "[conv2d] input (f32) and weight (f64) must share a dtype"},
      {"image",
       [] {
         max_pool2d(f32({2, 4, 4}), 2);
       },
       Kind::Shape, "[max_pool2d] input must be (N, C, H, W), got (2, 4, 4)"},
      {"image",
       [] {
         max_pool2d(f32({1, 1, 2, 2}), 3);
       },
       Kind::Shape, "[max_pool2d] kernel 3x3 is larger than the padded input 2x2"},
      {"image",
       [] {
         max_pool2d(f32({1, 1, 4, 4}), 0);
       },
       Kind::Value, "[max_pool2d] kernel 0x0"},
      {"image",
       [] {
         avg_pool2d(of({1, 1, 4, 4}, D::i64), 2);
       },
       Kind::DType, "[avg_pool2d] needs a floating input, got i64"},
      {"image",
       [] {
         avg_pool2d(f32({1, 4, 4}), 2);
       },
       Kind::Shape, "[avg_pool2d]"},
      {"image",
       [] {
         conv_transpose2d(f32({1, 3, 4, 4}), f32({2, 3, 3, 3}));
       },
       Kind::Shape,
       "[conv_transpose2d] input has 3 channels but the weight (2, 3, 3, 3) expects 2"},
      {"image",
       [] {
         conv_transpose2d(f32({1, 2, 4, 4}), f32({2, 3, 3, 3}), {}, 2, 0, {1, 2});
       },
       Kind::Value,
       "[conv_transpose2d] output padding 1x2 must be below the stride 2x2 or the dilation 1x1"},
      {"image",
       [] {
         conv_transpose2d(f32({1, 2, 4}), f32({2, 3, 3, 3}));
       },
       Kind::Shape, "[conv_transpose2d] input must be (N, C_in, H, W), got (1, 2, 4)"},
      {"image",
       [] {
         conv_transpose2d(f32({1, 2, 4, 4}), f32({2, 3, 3, 3}), f32({2}));
       },
       Kind::Shape, "[conv_transpose2d] bias must be (3), got (2)"},
      {"image",
       [] {
         conv_transpose2d(f32({1, 2, 2, 2}), f32({2, 3, 3, 3}), {}, 1, 2);
       },
       Kind::Shape,
       "[conv_transpose2d] input (1, 2, 2, 2) with kernel 3x3, stride 1x1 and padding 2x2 gives "
       "an empty 0x0 output"},
      {"image",
       [] {
         conv_transpose2d(f32({1, 2, 3, 2}), f32({2, 3, 3, 3}), {}, {int64_t(1) << 62, 1});
       },
       Kind::Value, "[conv_transpose2d] input (1, 2, 3, 2) with kernel 3x3, stride"},
      {"image",
       [] {
         interpolate(f32({1, 1, 4, 4}), 8, "cubic");
       },
       Kind::Value,
       "[interpolate] mode must be \"nearest\", \"nearest-exact\", \"linear\", \"bilinear\", "
       "\"bicubic\", \"trilinear\" or \"area\", got \"cubic\""},
      {"image",
       [] {
         interpolate(f32({1, 1, 4, 4}), 8, "trilinear");
       },
       Kind::Shape,
       "[interpolate] mode \"trilinear\" needs (N, C, D, H, W) input, got (1, 1, 4, 4)"},
      {"image",
       [] {
         interpolate(f32({1, 1, 4}), Size3{2, 2, 2});
       },
       Kind::Shape, "[interpolate] input must be (N, C, D, H, W), got (1, 1, 4)"},
      {"image",
       [] {
         upsample(f32({2, 4}), 2);
       },
       Kind::Shape,
       "[upsample] input must be (N, C, L), (N, C, H, W) or (N, C, D, H, W), got (2, 4)"},
      {"image",
       [] {
         interpolate(f32({1, 1, 4, 4}), 8, "nearest", true);
       },
       Kind::Value,
       "[interpolate] align_corners is for the interpolating modes \"linear\", \"bilinear\", "
       "\"bicubic\" and \"trilinear\", not \"nearest\""},
      {"image",
       [] {
         interpolate(f32({1, 1, 4, 4}), 2, "area", true);
       },
       Kind::Value,
       "[interpolate] align_corners is for the interpolating modes \"linear\", \"bilinear\", "
       "\"bicubic\" and \"trilinear\", not \"area\""},
      {"image",
       [] {
         upsample(of({1, 1, 4, 4}, D::i32), 2, "bicubic");
       },
       Kind::DType, "[upsample] mode \"bicubic\" needs a floating input, got i32"},
      {"image",
       [] {
         interpolate(of({1, 1, 4, 4}, D::i64), 8, "bilinear");
       },
       Kind::DType, "[interpolate] mode \"bilinear\" needs a floating input, got i64"},
      {"image",
       [] {
         interpolate(f32({1, 4, 4}), {8, 8});
       },
       Kind::Shape, "[interpolate] input must be (N, C, H, W), got (1, 4, 4)"},
      {"image",
       [] {
         interpolate(f32({1, 1, 4, 4}), {8, 0});
       },
       Kind::Value, "[interpolate] output size 8x0 must be positive"},
      {"image",
       [] {
         upsample(f32({1, 1, 4, 4}), -2);
       },
       Kind::Value, "[upsample] scale_factor must be positive and finite, got -2"},
      {"image",
       [] {
         upsample(f32({1, 1, 4, 4}), 0.1);
       },
       Kind::Value, "[upsample] output size 0x0 must be positive"},
      {"image",
       [] {
         max_pool2d(f32({1, 1, 6, 6}), 3, 1, {1, 2});
       },
       Kind::Value, "[max_pool2d] padding 1x2 must be at most half the kernel 3x3"},
      {"image",
       [] {
         avg_pool2d(f32({1, 1, 6, 6}), {2, 4}, 0, {2, 0}, true);
       },
       Kind::Value, "[avg_pool2d] padding 2x0 must be at most half the kernel 2x4"},
      {"image",
       [] {
         max_pool2d(of({1, 1, 4, 4}, D::b8), 2);
       },
       Kind::DType, "[max_pool2d] is not defined for b8 input"},
      {"image",
       [] {
         adaptive_avg_pool2d(f32({1, 1, 4, 4}), {2, 0});
       },
       Kind::Value, "[adaptive_avg_pool2d] output size 2x0 must be positive"},
      {"image",
       [] {
         adaptive_max_pool2d(f32({1, 3, 0, 4}), 2);
       },
       Kind::Shape, "[adaptive_max_pool2d] input (1, 3, 0, 4) has an empty image"},
      {"image",
       [] {
         adaptive_max_pool2d(f32({3, 4, 4}), 2);
       },
       Kind::Shape, "[adaptive_max_pool2d] input must be (N, C, H, W), got (3, 4, 4)"},
      {"image",
       [] {
         adaptive_avg_pool2d(of({1, 1, 4, 4}, D::i32), 2);
       },
       Kind::DType, "[adaptive_avg_pool2d] needs a floating input, got i32"},
      {"image",
       [] {
         avg_pool2d(f32({1, 1, 4, 4}), 2, 0, 0, false, true, -1);
       },
       Kind::Value, "[avg_pool2d] divisor_override -1 must be positive (0: none)"},
      // The 1-D ops check their arguments in 1-D words (core/ops/window1d.cpp).
      {"sequence",
       [] {
         conv1d(f32({2, 4, 9}), f32({6, 3, 3}));
       },
       Kind::Shape, "[conv1d] input (2, 4, 9) has 4 channels but the weight (6, 3, 3) expects 3"},
      {"sequence",
       [] {
         conv1d(f32({2, 4, 9}), f32({3, 2, 3}), {}, 1, 0, 2);
       },
       Kind::Shape, "[conv1d] the weight (3, 2, 3) has 3 filters, which 2 groups do not divide"},
      {"sequence",
       [] {
         conv1d(f32({2, 4, 9}), f32({6, 4, 3, 1}));
       },
       Kind::Shape, "[conv1d] weight must be (out, in / groups, k), got (6, 4, 3, 1)"},
      {"sequence",
       [] {
         conv1d(f32({4, 2}), f32({6, 4, 3}));
       },
       Kind::Shape, "[conv1d] kernel_size 3 is larger than the padded input length 2 of (4, 2)"},
      {"sequence",
       [] {
         conv1d(f32({1, 4, 5}), f32({6, 4, 3}), {}, 1, 0, 1, 3);
       },
       Kind::Shape,
       "[conv1d] kernel_size 3 dilated by 3 is larger than the padded input length 5 of (1, 4, "
       "5)"},
      {"sequence",
       [] {
         conv1d(f32({1, 4, 5}), f32({6, 4, 3}), {}, 0);
       },
       Kind::Value,
       "[conv1d] kernel_size 3, stride 0 and dilation 1 must be positive and padding 0 "
       "non-negative"},
      {"sequence",
       [] {
         conv1d(f32({1, 4, 5}), f32({6, 4, 3}), {}, 2, kSame);
       },
       Kind::Value, "[conv1d] padding \"same\" needs stride 1, got 2"},
      {"sequence",
       [] {
         max_pool1d(f32({2, 3, 4, 5}), 2);
       },
       Kind::Shape, "[max_pool1d] input must be (N, C, L) or unbatched (C, L), got (2, 3, 4, 5)"},
      {"sequence",
       [] {
         max_pool1d(f32({2, 6}), 3, 1, 2);
       },
       Kind::Value, "[max_pool1d] padding 2 must be at most half the kernel_size 3"},
      {"sequence",
       [] {
         avg_pool1d(of({2, 6}, D::i64), 2);
       },
       Kind::DType, "[avg_pool1d] needs a floating input, got i64 (from avg_pool2d)"},
      {"sequence",
       [] {
         adaptive_max_pool1d(f32({2, 0}), 1);
       },
       Kind::Shape, "[adaptive_max_pool1d] input (2, 0) is empty along L"},
      // The 3-D ops check their arguments in 3-D words (core/ops/volume.cpp).
      {"volume",
       [] {
         conv3d(f32({1, 4, 3, 3, 3}), f32({6, 3, 2, 2, 2}));
       },
       Kind::Shape, "[conv3d] input has 4 channels but the weight (6, 3, 2, 2, 2) expects 3"},
      {"volume",
       [] {
         conv3d(f32({1, 4, 3, 3, 3}), f32({3, 2, 2, 2, 2}), {}, 1, 0, 2);
       },
       Kind::Shape, "[conv3d] the weight (3, 2, 2, 2, 2) has 3 filters, which 2 groups do not divide"},
      {"volume",
       [] {
         conv3d(f32({1, 4, 3, 3}), f32({6, 4, 2, 2}));
       },
       Kind::Shape, "[conv3d] weight must be (out, in / groups, kd, kh, kw), got (6, 4, 2, 2)"},
      {"volume",
       [] {
         conv3d(f32({1, 2, 3, 5, 5}), f32({2, 2, 2, 2, 2}), f32({3}));
       },
       Kind::Shape, "[conv3d] bias must be (2), got (3)"},
      {"volume",
       [] {
         conv3d(f32({1, 2, 2, 5, 5}), f32({2, 2, 3, 2, 2}));
       },
       Kind::Shape,
       "[conv3d] kernel_size 3x2x2 is larger than the padded input 2x5x5 of (1, 2, 2, 5, 5)"},
      {"volume",
       [] {
         conv3d(f32({1, 2, 4, 4, 4}), f32({2, 2, 2, 2, 2}), {}, Size3{1, 0, 1});
       },
       Kind::Value,
       "[conv3d] kernel_size 2, stride 1x0x1 and dilation 1 must be positive and padding 0 "
       "non-negative"},
      {"volume",
       [] {
         conv3d(f32({1, 1, 2, 2, 2}), f32({1, 1, 1, 1, 1}), {}, 1, Size3{0, 0, int64_t(1) << 62});
       },
       Kind::Value,
       "[conv3d] kernel_size 1 dilated by 1 or padding 0x0x4611686018427387904 overflows int64"},
      {"volume",
       [] {
         conv3d(f32({1, 2, 4, 4, 4}), f32({2, 2, 2, 2, 2}), {}, 2, kSame);
       },
       Kind::Value, "[conv3d] padding \"same\" needs stride 1, got 2"},
      {"volume",
       [] {
         conv_transpose3d(f32({1, 4, 3, 3, 3}), f32({3, 2, 2, 2, 2}));
       },
       Kind::Shape, "[conv_transpose3d] input has 4 channels but the weight (3, 2, 2, 2, 2) expects 3"},
      {"volume",
       [] {
         conv_transpose3d(f32({1, 4, 3, 3, 3}), f32({4, 2, 2, 2, 2}), {}, 2, 0, {1, 2, 1});
       },
       Kind::Value,
       "[conv_transpose3d] output padding 1x2x1 must be below the stride 2 or the dilation 1"},
      {"volume",
       [] {
         conv_transpose3d(f32({1, 2, 1, 3, 3}), f32({2, 2, 1, 2, 2}), {}, 1, {1, 0, 0});
       },
       Kind::Shape,
       "[conv_transpose3d] input (1, 2, 1, 3, 3) with kernel 1x2x2, stride 1 and padding 1x0x0 "
       "gives an empty depth -1"},
      {"volume",
       [] {
         max_pool3d(f32({2, 3, 4, 5, 6, 7}), 2);
       },
       Kind::Shape,
       "[max_pool3d] input must be (N, C, D, H, W) or unbatched (C, D, H, W), got (2, 3, 4, 5, 6, "
       "7)"},
      {"volume",
       [] {
         max_pool3d(f32({1, 2, 6, 6, 6}), 3, 1, Size3{1, 2, 1});
       },
       Kind::Value, "[max_pool3d] padding 1x2x1 must be at most half the kernel_size 3"},
      {"volume",
       [] {
         avg_pool3d(of({1, 2, 4, 4, 4}, D::i64), 2);
       },
       Kind::DType, "[avg_pool3d] needs a floating input, got i64"},
      {"volume",
       [] {
         adaptive_avg_pool3d(f32({2, 0, 3, 3}), 1);
       },
       Kind::Shape, "[adaptive_avg_pool3d] input (2, 0, 3, 3) has an empty volume"},
      {"volume",
       [] {
         adaptive_max_pool3d(f32({1, 2, 3, 3, 3}), Size3{1, 0, 1});
       },
       Kind::Value, "[adaptive_max_pool3d] output_size 1x0x1 must be positive"},
      {"sequence",
       [] {
         adaptive_avg_pool1d(f32({1, 2, 6}), 0);
       },
       Kind::Value, "[adaptive_avg_pool1d] output_size 0 must be positive"},
      {"image",
       [] {
         unfold(f32({1, 4, 4}), 2);
       },
       Kind::Shape, "[unfold] input must be (N, C, H, W)"},
      {"image",
       [] {
         unfold(f32({1, 1, 2, 2}), 3);
       },
       Kind::Shape, "[unfold] kernel 3x3 is larger than the padded input 2x2"},
      {"image",
       [] {
         unfold(of({1, 1, 2, 2}, D::b8), 2);
       },
       Kind::DType, "[unfold] is not defined for b8"},
      {"image",
       [] {
         fold(f32({1, 4, 5}), 3, 3, 2);
       },
       Kind::Shape, "[fold] columns must be (N, C*2*2, 4), got (1, 4, 5)"},
      {"image",
       [] {
         fold(f32({4, 4}), 3, 3, 2);
       },
       Kind::Shape, "[fold] columns must be"},
      {"image",
       [] {
         fold(f32({1, 4, 4}), 1, 1, 2);
       },
       Kind::Shape, "[fold] kernel 2x2 is larger than the padded input 1x1"},
      {"image", [] { fold(f32({1, 4, 4}), 3, 3, 2, 0); }, Kind::Value,
       "[fold] kernel 2x2 and stride 0x0 must be positive"},
      // Normalizations, linear and losses.
      {"nn", [] { softmax(of({3}, D::i64), 0); }, Kind::DType,
       "[softmax] needs a floating input, got i64"},
      {"nn", [] { softmax(f32({2, 3}), 2); }, Kind::Value, "[softmax] dim 2 is out of range"},
      {"nn", [] { log_softmax(of({3}, D::i32), 0); }, Kind::DType, "[log_softmax]"},
      {"nn", [] { log_softmax(f32({3}), -2); }, Kind::Value,
       "[log_softmax] dim -2 is out of range"},
      {"nn", [] { logsumexp(f32({3}), 1); }, Kind::Value, "[logsumexp] dim 1 is out of range"},
      {"nn", [] { linear(f32({2, 3}), f32({4, 2})); }, Kind::Shape,
       "[linear] input (2, 3) has 3 features but the weight (4, 2) expects 2"},
      {"nn", [] { linear(f32({2, 3}), f32({3})); }, Kind::Shape,
       "[linear] weight must be (out, in)"},
      {"nn", [] { linear(f32({2, 3}), f32({4, 3}), f32({3})); }, Kind::Shape,
       "[linear] bias must be (4), got (3)"},
      {"nn", [] { linear(f32({2, 3}), of({4, 3}, D::f64)); }, Kind::DType,
       "[linear] input (f32) and weight (f64) must share a dtype"},
      {"nn", [] { layer_norm(f32({2, 3}), {2}); }, Kind::Shape,
       "[layer_norm] normalized shape (2) does not match the last dims of (2, 3)"},
      {"nn", [] { layer_norm(f32({3}), {2, 3}); }, Kind::Shape,
       "[layer_norm] normalized shape (2, 3) does not fit input (3)"},
      {"nn", [] { layer_norm(f32({2, 3}), {3}, f32({2})); }, Kind::Shape,
       "[layer_norm] weight (2) must have shape (3)"},
      {"nn", [] { layer_norm(of({2, 3}, D::i64), {3}); }, Kind::DType,
       "[layer_norm] needs a floating input"},
      {"nn", [] { mse_loss(f32({3}), f32({4})); }, Kind::Shape,
       "[mse_loss] prediction (3) and target (4) must have the same shape"},
      {"nn", [] { cross_entropy(f32({2, 3}), of({2}, D::f32)); }, Kind::Shape,
       "[cross_entropy] class probabilities must have the logits' shape: logits (2, 3) and "
       "targets (2)"},
      {"nn", [] { cross_entropy(f32({2, 3}), of({2}, D::i32)); }, Kind::DType,
       "[cross_entropy] targets must be i64 class indices or floating class probabilities, got "
       "i32 of shape (2)"},
      {"nn", [] { cross_entropy(f32({2, 3}), of({3}, D::i64)); }, Kind::Shape,
       "[cross_entropy] expected logits (N, C, d1, ...) with class indices (N, d1, ...)"},
      {"nn", [] { cross_entropy(f32({2, 3, 4}), of({2}, D::i64)); }, Kind::Shape,
       "[cross_entropy]"},
      {"nn", [] { cross_entropy(of({2, 3}, D::i64), of({2}, D::i64)); }, Kind::DType,
       "[cross_entropy] logits must be floating, got i64"},
      {"nn", [] { cross_entropy(f32({2, 3}), i64s({0, 3})); }, Kind::Value,
       "[cross_entropy] index 3 is out of range for dim 1 of size 3 (from gather)"},
      {"nn", [] { cross_entropy(f32({2, 3}), i64s({-1, 0})); }, Kind::Value,
       "[cross_entropy] index -1 is out of range for dim 1 of size 3 (from gather)"},
      // Composites name themselves in errors raised inside them (as cross_entropy above).
      {"nn", [] { mse_loss(f32({3}), f32({4})); }, Kind::Shape, "[mse_loss]"},
      {"nn", [] { log_softmax(f32({2, 3}), 5); }, Kind::Value, "[log_softmax]"},
      {"nn", [] { binary_cross_entropy_with_logits(f32({3}), f32({4})); }, Kind::Shape,
       "[binary_cross_entropy_with_logits] logits (3) and targets (4) must have the same shape"},
      {"nn", [] { binary_cross_entropy_with_logits(f32({3}), of({3}, D::i64)); }, Kind::DType,
       "[binary_cross_entropy_with_logits] targets must be floating"},
      // The activations (core/ops/activations.cpp).
      {"activation", [] { leaky_relu(of({3}, D::i64)); }, Kind::DType,
       "[leaky_relu] needs a floating input, got i64 (input (3))"},
      {"activation", [] { elu(f32({3}), INFINITY); }, Kind::Value,
       "[elu] alpha must be finite, got inf"},
      {"activation", [] { celu(f32({3}), 0); }, Kind::Value,
       "[celu] alpha must be finite and nonzero, got 0"},
      {"activation", [] { hardtanh(f32({3}), 2, 1); }, Kind::Value,
       "[hardtanh] min_val 2 must be at most max_val 1"},
      {"activation", [] { glu(f32({3, 5})); }, Kind::Shape,
       "[glu] dim -1 of (3, 5) must have an even size, got 5"},
      {"activation", [] { glu(f32({3, 4}), 2); }, Kind::Value,
       "[glu] dim 2 is out of range for (3, 4)"},
      {"activation", [] { prelu(f32({2, 3}), f32({2})); }, Kind::Shape,
       "[prelu] weight (2) must hold 1 value or one per channel (dim 1 of (2, 3))"},
      // The normalizations (core/ops/norms.cpp).
      {"norm", [] { rms_norm(f32({2, 3}), {2}); }, Kind::Shape,
       "[rms_norm] normalized shape (2) does not match the last dims of (2, 3)"},
      {"norm", [] { rms_norm(f32({2, 3}), {3}, f32({2})); }, Kind::Shape,
       "[rms_norm] weight (2) must have shape (3)"},
      {"norm", [] { group_norm(f32({2, 6, 3}), 4); }, Kind::Value,
       "[group_norm] 6 channels of input (2, 6, 3) do not split into 4 groups"},
      {"norm", [] { group_norm(f32({6}), 2); }, Kind::Shape,
       "[group_norm] input must be (N, C, ...), got (6)"},
      {"norm", [] { group_norm(f32({2, 6}), 2, f32({3})); }, Kind::Shape,
       "[group_norm] weight and bias must be (6), got (3)"},
      {"norm", [] { normalize(f32({2, 3}), 0); }, Kind::Value,
       "[normalize] p must be positive, got 0"},
      {"norm", [] { cosine_similarity(f32({2, 3}), f32({2, 4})); }, Kind::Shape,
       "[cosine_similarity] inputs (2, 3) and (2, 4) must have one number of dims"},
      // The losses (core/ops/losses.cpp).
      {"loss", [] { l1_loss(f32({3}), f32({4})); }, Kind::Shape,
       "[l1_loss] input (3) and target (4) must have the same shape"},
      {"loss", [] { l1_loss(f32({3}), f32({3}), "avg"); }, Kind::Value,
       "[l1_loss] reduction must be \"none\", \"mean\" or \"sum\", got \"avg\""},
      {"loss", [] { smooth_l1_loss(f32({3}), f32({3}), "mean", -1); }, Kind::Value,
       "[smooth_l1_loss] beta must be non-negative and finite, got -1"},
      {"loss", [] { huber_loss(f32({3}), f32({3}), "mean", 0); }, Kind::Value,
       "[huber_loss] delta must be positive and finite, got 0"},
      {"loss", [] { kl_div(f32({3}), of({3}, D::f64)); }, Kind::DType,
       "[kl_div] needs a floating input and target of one dtype, got f32 and f64"},
      {"loss", [] { kl_div(f32({3}), f32({3}), "batch"); }, Kind::Value,
       "[kl_div] reduction must be \"none\", \"mean\", \"batchmean\" or \"sum\""},
      {"loss", [] { mse_loss(f32({3}), f32({3}), "max"); }, Kind::Value,
       "[mse_loss] reduction must be \"none\", \"mean\" or \"sum\", got \"max\""},
      {"loss", [] { binary_cross_entropy(f32({2, 3}), f32({2, 3}), f32({2})); }, Kind::Shape,
       "[binary_cross_entropy] weight (2) must broadcast to the input's shape (2, 3)"},
      {"loss", [] { binary_cross_entropy(f32({3}), f32({3}), Tensor(), "avg"); }, Kind::Value,
       "[binary_cross_entropy] reduction must be \"none\", \"mean\" or \"sum\", got \"avg\""},
      {"loss",
       [] { binary_cross_entropy_with_logits(f32({3}), f32({3}), "mean", Tensor(), of({3}, D::i64)); },
       Kind::DType, "[binary_cross_entropy_with_logits] pos_weight must be floating, got i64"},
      {"loss", [] { binary_cross_entropy_with_logits(f32({3}), f32({4}), "sum"); }, Kind::Shape,
       "[binary_cross_entropy_with_logits] input (3) and target (4) must have the same shape"},
      {"loss", [] { nll_loss(f32({2, 3}), of({2}, D::i64), f32({2})); }, Kind::Shape,
       "[nll_loss] weight must be 1-D with one element per class: log_probs (2, 3) have 3 "
       "classes, weight has shape (2)"},
      {"loss", [] { nll_loss(f32({2, 3}), of({2}, D::i64), of({3}, D::i64)); }, Kind::DType,
       "[nll_loss] weight must be floating, got i64"},
      {"loss", [] { soft_margin_loss(f32({3}), of({3}, D::f64)); }, Kind::DType,
       "[soft_margin_loss] needs floating operands of one dtype, got input f32 and target f64"},
      {"loss", [] { hinge_embedding_loss(f32({3}), f32({3}), 1, "avg"); }, Kind::Value,
       "[hinge_embedding_loss] reduction must be \"none\", \"mean\" or \"sum\", got \"avg\""},
      {"loss", [] { triplet_margin_loss(f32({2, 3}), f32({2, 3}), f32({2, 4})); }, Kind::Shape,
       "[triplet_margin_loss] anchor (2, 3) and negative (2, 4) must have the same shape"},
      {"loss", [] { gaussian_nll_loss(f32({3}), f32({3}), f32({3}), false, 0); }, Kind::Value,
       "[gaussian_nll_loss] eps must be positive, got 0"},
      {"loss", [] { pairwise_distance(f32({3}), f32({3}), -1); }, Kind::Value,
       "[pairwise_distance] p must be non-negative, got -1"},
      {"index", [] { embedding_bag(of({4}, D::i64), f32({5, 3}), of({2}, D::i64), "min"); },
       Kind::Value, "[embedding_bag] mode must be \"sum\", \"mean\" or \"max\", got \"min\""},
      {"index",
       [] {
         embedding_bag(of({4}, D::i64), f32({5, 3}), tensor({1, 2}, Options().dtype(D::i64)));
       },
       Kind::Value, "[embedding_bag] offsets must start at 0 and not decrease, up to the input's 4 indices"},
      {"index",
       [] { embedding_bag(of({4}, D::i64), f32({5, 3}), of({2}, D::i64), "mean", f32({4})); },
       Kind::Value, "[embedding_bag] per_sample_weights needs mode \"sum\", got \"mean\""},
      {"index", [] { embedding_bag(of({2, 2}, D::i64), f32({5, 3}), of({2}, D::i64)); },
       Kind::Shape,
       "[embedding_bag] expected a 1-D input with 1-D offsets, or a 2-D input (each row a bag) "
       "without offsets; got input (2, 2) and offsets (2)"},
      {"loss", [] { narrow(f32({2, 6}), 1, 5, 2); }, Kind::Value,
       "[narrow] start 5 + length 2 exceeds dim 1 of size 6 (shape (2, 6))"},
      {"loss", [] { narrow(f32({2, 6}), 1, -7, 1); }, Kind::Value,
       "[narrow] start -7 and length 1 do not fit dim 1 of size 6 (shape (2, 6)): expected a "
       "start in [-6, 6] and a non-negative length"},
      {"loss", [] { multi_margin_loss(f32({2, 3}), of({2}, D::i64), 3); }, Kind::Value,
       "[multi_margin_loss] p must be 1 or 2, got 3"},
      {"loss", [] { multi_margin_loss(f32({2, 3}), of({3}, D::i64)); }, Kind::Shape,
       "[multi_margin_loss] target must be (N) for input (N, C), or 0-d for (C) for input (2, 3), "
       "got (3)"},
      {"loss", [] { multi_margin_loss(f32({2, 3}), f32({2})); }, Kind::DType,
       "[multi_margin_loss] target must be i64 class indices, got f32"},
      {"loss", [] { multilabel_margin_loss(f32({2, 3, 4}), of({2, 3, 4}, D::i64)); }, Kind::Shape,
       "[multilabel_margin_loss] input must be (N, C) or (C), got (2, 3, 4)"},
      {"loss", [] { multilabel_margin_loss(f32({2, 3}), of({2, 4}, D::i64)); }, Kind::Shape,
       "[multilabel_margin_loss] target must be the input's shape for input (2, 3), got (2, 4)"},
      {"loss", [] { multilabel_soft_margin_loss(f32({2, 3}), f32({2, 3}), f32({2})); },
       Kind::Shape,
       "[multilabel_soft_margin_loss] weight must be 1-D with one element per class (3), got (2)"},
      // Randomness.
      {"random", [] { dropout(f32({3}), 1.5, true); }, Kind::Value,
       "[dropout] probability must be in [0, 1], got 1.5"},
      {"random", [] { dropout(f32({3}), -0.1, false); }, Kind::Value, "[dropout]"},
      {"random", [] { dropout(f32({3}), std::nan(""), true); }, Kind::Value, "[dropout]"},
      {"random", [] { dropout(of({3}, D::i64), 0.5, true); }, Kind::DType,
       "[dropout] needs a floating input, got i64"},
      {"random", [] { rand({2}, Options().dtype(D::i64)); }, Kind::DType,
       "[rand] dtype must be floating, got i64"},
      {"random", [] { randn({2}, Options().dtype(D::b8)); }, Kind::DType, "[randn]"},
      {"random", [] { rand({2, -1}); }, Kind::Value, "[rand] negative size -1 in shape (2, -1)"},
      {"random", [] { randint(0, {2}); }, Kind::Value, "[randint] high must be positive, got 0"},
      {"random", [] { randint(5, {2}, Options().dtype(D::b8)); }, Kind::DType,
       "[randint] dtype must be numeric"},
      {"random", [] { randint(int64_t(1) << 40, {2}, Options().dtype(D::i32)); }, Kind::Value,
       "[randint] high 1099511627776 is out of range for i32"},
      {"random", [] { randint((int64_t(1) << 24) + 1, {2}, Options().dtype(D::f32)); }, Kind::Value,
       "[randint] high 16777217 is out of range for f32"},
      // Reading values and conversions.
      {"tensor", [] { f32({2}).item<float>(); }, Kind::Value, "[item] needs exactly one element"},
      {"tensor", [] { f32({0}).item<float>(); }, Kind::Value, "[item]"},
      {"tensor", [] { f32({2}).data_ptr<int32_t>(); }, Kind::DType, "[data_ptr]"},
      {"tensor", [] { f32({2}).size(1); }, Kind::Value, "[size]"},
      // Sizes whose products overflow int64, and negative sizes (Note [Checked sizes]). Before
      // the check these wrapped: arange(2^62) wrote past a tiny buffer, (2^62 + 1) x 4 had 4
      // elements, 2^32 x 2^32 had 0, and INT64_MAX elements were reported as a duet bug.
      {"sizes", [] { arange(int64_t(1) << 62); }, Kind::Value,
       "[arange] shape (4611686018427387904) is too large"},
      {"sizes", [] { zeros({(int64_t(1) << 62) + 1, 4}); }, Kind::Value,
       "[full] shape (4611686018427387905, 4) is too large"},
      {"sizes", [] { zeros({int64_t(1) << 32, int64_t(1) << 32}); }, Kind::Value,
       "[full] shape (4294967296, 4294967296) is too large"},
      {"sizes", [] { ones({3037000500, 3037000500}); }, Kind::Value,
       "[full] shape (3037000500, 3037000500) is too large"},
      {"sizes", [] { zeros({INT64_MAX}); }, Kind::Value,
       "[full] shape (9223372036854775807) is too large"},
      {"sizes", [] { zeros({0, int64_t(1) << 40, int64_t(1) << 40}); }, Kind::Value,
       "[full] shape (0, 1099511627776, 1099511627776) is too large"},
      {"sizes", [] { sum(expand(ones({1, 1}), {int64_t(1) << 32, int64_t(1) << 32})); },
       Kind::Value, "[expand] shape (4294967296, 4294967296) is too large"},
      {"sizes", [] { reshape(arange(4), {(int64_t(1) << 62) + 1, 4}); }, Kind::Value, "[reshape]"},
      {"sizes", [] { zeros({-1}); }, Kind::Value, "[full] negative size -1 in shape (-1)"},
      {"sizes", [] { tensor({1, 2, 3}, Shape{-1, -3}); }, Kind::Value,
       "[tensor] shape (-1, -3) has a negative size"},
      {"sizes", [] { detail::empty(Shape{int64_t(1) << 61}, DType::f64); }, Kind::Value,
       "[empty] shape (2305843009213693952) is too large"},
      // The fused recurrent cells (Note [LSTM cell] in core/ops/rnn.cpp).
      {"rnn cells", [] { fused_lstm_cell(randn({2, 8}), randn({2, 8}), randn({2, 3})); },
       Kind::Shape,
       "[fused_lstm_cell] gates_x and gates_h must be (..., 4H) for c (..., H) (2, 3)"},
      {"rnn cells", [] { fused_gru_cell(randn({2, 6}), randn({2, 6}), randn({3, 2})); },
       Kind::Shape, "[fused_gru_cell] gates_x and gates_h must be (..., 3H) for h (..., H) (3, 2)"},
      {"rnn cells", [] { fused_gru_cell(arange(6), arange(6), arange(2)); }, Kind::DType,
       "[fused_gru_cell] needs floating operands, got i64, i64 and i64"},
      {"rnn cells", [] { fused_lstm_cell(Tensor(), randn({8}), randn({2})); }, Kind::Value,
       "[fused_lstm_cell] gates_x, gates_h and c must be defined tensors"},
      // Pointwise composites, products and norms (core/ops/pointwise.cpp, stats.cpp, norms.cpp).
      {"math", [] { addcdiv(f32({3}), arange(3), arange(3)); }, Kind::DType,
       "[addcdiv] integer division (i64 (3) by i64 (3)) is not supported"},
      {"math", [] { lerp(arange(3), arange(3), 0.5); }, Kind::DType,
       "[lerp] needs floating operands, got start i64 (3), end i64 (3)"},
      {"math", [] { vector_norm(arange(3)); }, Kind::DType,
       "[vector_norm] needs a floating input, got i64 of shape (3)"},
      {"math", [] { vector_norm(f32({3}), NAN); }, Kind::Value,
       "[vector_norm] ord must be a number, got NaN"},
      {"math", [] { cdist(f32({2, 3}), f32({4, 2})); }, Kind::Shape,
       "[cdist] needs x1 (..., P, M) and x2 (..., R, M) with one M, got (2, 3) and (4, 2)"},
      {"math", [] { cdist(f32({2, 3}), f32({4, 3}), -1); }, Kind::Value,
       "[cdist] p must be non-negative, got -1"},
      {"math", [] { prod(f32({2, 3}), {1, -1}); }, Kind::Value,
       "[prod] dim 1 appears more than once in (1, -1)"},
      {"math", [] { cumprod(f32({2, 3}), 2); }, Kind::Any, "[cumprod]"},
      // Repeating and rearranging (core/ops/arrange.cpp).
      {"arrange", [] { f32({2, 3}).repeat({2}); }, Kind::Shape,
       "[repeat] needs a repeat for each of the 2 dims of (2, 3), got 1 ((2))"},
      {"arrange", [] { tile(f32({2}), {-1}); }, Kind::Value,
       "[tile] reps must be non-negative, got (-1)"},
      {"arrange", [] { movedim(f32({2, 3, 4}), {0, 1}, {2, 2}); }, Kind::Value,
       "[movedim] source (0, 1) and destination (2, 2) must each name a dim once"},
      {"arrange", [] { unflatten(f32({2, 6}), 1, {4, -1}); }, Kind::Shape,
       "[unflatten] sizes (4, -1) do not split dim 1 of size 6 (input (2, 6))"},
      {"arrange", [] { bmm(f32({2, 3, 4}), f32({3, 4, 5})); }, Kind::Shape,
       "[bmm] needs (B, n, m) and (B, m, p) with one B (no broadcasting), got (2, 3, 4) and (3, 4, "
       "5)"},
      {"arrange", [] { diag(f32({2, 2, 2})); }, Kind::Shape,
       "[diag] needs a vector (a matrix is made of it) or a matrix (its diagonal is taken), got "
       "(2, 2, 2)"},
      {"arrange", [] { meshgrid({f32({2})}, "ji"); }, Kind::Value,
       "[meshgrid] indexing must be \"ij\" or \"xy\", got \"ji\""},
      {"arrange", [] { outer(f32({2, 2}), f32({2})); }, Kind::Shape,
       "[outer] needs two 1-D tensors, got (2, 2) and (2)"},
  };
  return rows;
}

}  // namespace

TEST_CASE("error rows: the right error type, and a message that starts with [op]") {
  std::map<std::string, int> per_family;
  int sited = 0, sited_total = 0;
  std::vector<std::string> unsited;
  for (const ErrorRow& row : error_rows()) {
    INFO(std::string(row.family) << ": expected \"" << std::string(row.prefix) << "...\"");
    ++per_family[row.family];
    CHECK(row.prefix[0] == '[');
    std::string msg;
    bool threw = false;
    try {
      row.call();
    } catch (const Error& e) {
      threw = true;
      msg = e.what();
      switch (row.kind) {
        case Kind::Shape:
          CHECK_MESSAGE(dynamic_cast<const ShapeError*>(&e), msg);
          break;
        case Kind::DType:
          CHECK_MESSAGE(dynamic_cast<const DTypeError*>(&e), msg);
          break;
        case Kind::Value:
          CHECK_MESSAGE(dynamic_cast<const ValueError*>(&e), msg);
          break;
        case Kind::Any:
          break;
      }
      CHECK_MESSAGE(dynamic_cast<const InternalError*>(&e) == nullptr, msg);
    } catch (const std::exception& e) {
      FAIL_CHECK("not a duet::Error: " << e.what());
    }
    CHECK_MESSAGE(threw, "did not throw");
    if (threw) CHECK_MESSAGE(msg.rfind(row.prefix, 0) == 0, "got: " << msg);
    // Each names the line of this file that called the op (core/call_site.h), but for the
    // one row that calls an internal function (detail::empty), which no user calls.
    if (threw && msg.rfind("[empty]", 0) != 0) {
      ++sited_total;
      if (msg.find("(at test_errors.cpp:") != std::string::npos)
        ++sited;
      else
        unsited.push_back(msg);
    }
  }
  for (const std::string& m : unsited) MESSAGE("no call site: " << m);
  CHECK(sited == sited_total);
  // At least three bad inputs per op family.
  for (const auto& [family, n] : per_family) CHECK_MESSAGE(n >= 3, family);
  CHECK(per_family.size() == 21);
}

// ---- call sites (core/call_site.h) ------------------------------------------------------------

// The line an error message names: "... (at test_errors.cpp:123)" -> 123; 0 when none.
int site_line(const std::string& msg) {
  const std::string key = "(at test_errors.cpp:";
  const size_t at = msg.find(key);
  return at == std::string::npos ? 0 : std::atoi(msg.c_str() + at + key.size());
}

TEST_CASE("call sites: eager errors name the line that called the op") {
  const Tensor a = zeros({3}), b = zeros({4});
  // Operators on lvalues and on a temporary, unary minus, and a named function.
  int line = __LINE__ + 1;
  std::string e = error_of([&] { (void)(a + b); });
  CHECK(e ==
        fmt::format("[add] shapes (3) and (4) cannot broadcast (at test_errors.cpp:{})", line));
  line = __LINE__ + 1;
  e = error_of([&] { (void)((a * 2.0) - b); });
  CHECK(site_line(e) == line);
  line = __LINE__ + 1;
  e = error_of([&] { (void)(-zeros({2}, Options().dtype(DType::b8))); });
  CHECK(starts_with(e, "[neg]"));
  CHECK(site_line(e) == line);
  line = __LINE__ + 1;
  e = error_of([&] { (void)matmul(zeros({2, 3}), zeros({4, 5})); });
  CHECK(site_line(e) == line);
  line = __LINE__ + 1;
  e = error_of([&] { (void)(2.0 / zeros({2}) + b); });
  CHECK(site_line(e) == line);
  // A composite: its name, the primitive that failed, then the user's line (not the library's).
  line = __LINE__ + 1;
  e = error_of([&] { (void)embedding(zeros({4, 2}), i64s({1, 4})); });
  CHECK(e == fmt::format("[embedding] index 4 is out of range for dim 0 of size 4 (from gather) "
                         "(at test_errors.cpp:{})",
                         line));
  // A module: the line that called it, not a line inside the layer.
  nn::Linear lin(3, 2);
  line = __LINE__ + 1;
  e = error_of([&] { (void)lin(zeros({5, 4})); });
  CHECK(site_line(e) == line);
  // Methods: in-place arithmetic and item().
  Tensor c = zeros({2, 2});
  line = __LINE__ + 1;
  e = error_of([&] { c.add_(zeros({3})); });
  CHECK(site_line(e) == line);
  line = __LINE__ + 1;
  e = error_of([&] { (void)c.item<float>(); });
  CHECK(site_line(e) == line);
  // The site is the outermost call's and ends with it: later calls start clean.
  CHECK(detail::tls_site.file == nullptr);
}

TEST_CASE("call sites: errors while tracing name the line, the compiled function and the scope") {
  int line = 0;
  const int fn_line = __LINE__ + 1;
  auto f = compile([&line](Tensor x, Tensor y) {
    auto s = scope("encoder");
    line = __LINE__ + 1;
    return x + y;
  });
  std::string e = error_of([&] { f(zeros({16, 192}), zeros({16, 64})); });
  CHECK(e == fmt::format("[add] shapes (16, 192) and (16, 64) cannot broadcast (at "
                         "test_errors.cpp:{}) while tracing compiled function at "
                         "test_errors.cpp:{}, scope encoder",
                         line, fn_line));
  // Inside a scan body (the body is traced too).
  auto g = compile([&line](Tensor h, Tensor xs) {
    return scan(
        [&line](const std::vector<Tensor>& in) {
          line = __LINE__ + 1;
          Tensor n = in[0] + in[1];
          return std::vector<Tensor>{n, n};
        },
        {h}, {xs})[0];
  });
  e = error_of([&] { g(zeros({16, 192}), zeros({5, 16, 64})); });
  CHECK(starts_with(e, "[add] shapes (16, 192) and (16, 64) cannot broadcast"));
  CHECK(site_line(e) == line);
  CHECK(contains(e, "while tracing compiled function at test_errors.cpp:"));
}

TEST_CASE("call sites: the tracer's own errors name the line and the compiled function") {
  // A view made before an in-place write through another view, read after it.
  Tensor w = zeros({4});
  int line = 0;
  auto f = compile([&](Tensor x) {
    Tensor head = slice(w, 0, 0, 2);
    w.add_(x);
    line = __LINE__ + 1;
    return head * 2;
  });
  std::string e = error_of([&] { f(ones({4})); });
  CHECK(contains(e, "reads memory that was written in place through another view"));
  CHECK(site_line(e) == line);
  CHECK(contains(e, "while tracing compiled function at test_errors.cpp:"));
  // A tensor of a finished trace, used eagerly: the line that used it.
  Tensor leaked;
  auto g = compile([&](Tensor x) {
    leaked = x * 2;
    return x + 1;
  });
  g(ones({2}));
  line = __LINE__ + 1;
  e = error_of([&] { (void)(leaked + 1); });
  CHECK(contains(e, "used after that trace ended"));
  CHECK(site_line(e) == line);
}

TEST_CASE("call sites: traced nodes carry them into str(), dot() and errors of a running plan") {
  int add_line = 0, mm_line = 0, sm_line = 0, gather_line = 0;
  auto f = compile([&](Tensor x, Tensor w, Tensor idx) {
    mm_line = __LINE__ + 1;
    Tensor h = matmul(x, w);
    add_line = __LINE__ + 1;
    h = h + 1.0;
    sm_line = __LINE__ + 1;
    Tensor p = softmax(h, 1);
    gather_line = __LINE__ + 1;
    return gather(p, 1, idx);
  });
  const Tensor x = ones({2, 3}), w = ones({3, 4});
  (void)f(x, w, reshape(i64s({0, 1}), {2, 1}));
  const std::string g = f.graph().str();
  for (int l : {add_line, mm_line, sm_line, gather_line}) {
    INFO("line " << l << "\n" << g);
    CHECK(contains(g, fmt::format("at test_errors.cpp:{}\n", l)));
  }
  // Every node softmax made carries the line of the softmax call.
  int softmax_nodes = 0;
  for (const auto& n : f.graph().nodes)
    if (n.site && n.site.line == uint32_t(sm_line)) ++softmax_nodes;
  CHECK(softmax_nodes >= 3);
  CHECK(contains(f.graph().dot(), fmt::format("at test_errors.cpp:{}", gather_line)));
  // An index out of range found while the plan runs names the gather's line.
  const std::string e = error_of([&] { f(x, w, reshape(i64s({0, 7}), {2, 1})); });
  CHECK(starts_with(e, "[gather] index 7 is out of range"));
  CHECK(site_line(e) == gather_line);
}

TEST_CASE("an error leaves the operands untouched and the library usable") {
  Tensor a = tensor({1, 2, 3});
  Tensor b = tensor({1, 2});
  CHECK_THROWS_AS(a + b, ShapeError);
  CHECK(values(a) == std::vector<double>{1, 2, 3});
  CHECK(values(a + a) == std::vector<double>{2, 4, 6});
}

}  // namespace duet::test
