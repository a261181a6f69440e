// Error rows: bad inputs for every op family. Each must throw duet::Error of the expected kind
// (ShapeError, DTypeError, ValueError) with a message that starts with "[op]".
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
      {"creation", [] { tensor({1}, {}, Options().dtype(DType::f16)); }, Kind::DType,
       "[tensor] dtype f16 is not computed on the CPU"},
      {"creation", [] { arange(-1); }, Kind::Value, "[arange] length must be non-negative"},
      {"creation", [] { arange(3, Options().dtype(DType::b8)); }, Kind::DType, "[arange]"},
      {"creation", [] { arange(3, Options().dtype(DType::bf16)); }, Kind::DType, "[arange]"},
      {"creation", [] { zeros({2}, Options().dtype(DType::f16)); }, Kind::DType,
       "[full] dtype f16 is not computed on the CPU"},
      {"creation",
       [] {
         full({2, -1}, 1.0);
       },
       Kind::Value, "[full] negative size -1"},
      {"creation", [] { eye(-2); }, Kind::Value, "[eye]"},
      {"creation", [] { eye(2, Options().dtype(DType::f16)); }, Kind::DType, "[eye]"},
      {"creation", [] { ones({2}, Options().dtype(DType::i64).requires_grad()); }, Kind::DType,
       "[requires_grad_] only floating tensors can require gradients"},
      // Reading values and conversions.
      {"tensor", [] { f32({2}).item<float>(); }, Kind::Value, "[item] needs exactly one element"},
      {"tensor", [] { f32({0}).item<float>(); }, Kind::Value, "[item]"},
      {"tensor", [] { f32({2}).to(DType::f16); }, Kind::DType,
       "[cast] dtype f16 is not computed on the CPU"},
      {"tensor", [] { f32({2}).data_ptr<int32_t>(); }, Kind::DType, "[data_ptr]"},
      {"tensor", [] { f32({2}).size(1); }, Kind::Value, "[size]"},
  };
  return rows;
}

}  // namespace

TEST_CASE("error rows: the right error type, and a message that starts with [op]") {
  std::map<std::string, int> per_family;
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
  }
  // At least three bad inputs per op family.
  for (const auto& [family, n] : per_family) CHECK_MESSAGE(n >= 3, family);
  CHECK(per_family.size() == 7);
}

TEST_CASE("an error leaves the operands untouched and the library usable") {
  Tensor a = tensor({1, 2, 3});
  Tensor b = tensor({1, 2});
  CHECK_THROWS_AS(a + b, ShapeError);
  CHECK(values(a) == std::vector<double>{1, 2, 3});
  CHECK(values(a + a) == std::vector<double>{2, 4, 6});
}

}  // namespace duet::test
