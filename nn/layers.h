// duet: layers (torch.nn's), each a Module built only from duet ops, so one definition serves the
// eager face and the compiled face. Public Tensor members carry PyTorch's names; constructor
// arguments out of range raise a duet::Error naming the layer, and bad inputs raise the op's.
#pragma once

#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "nn/module.h"

namespace duet::nn {

/// y = x @ weight^T + bias, over the last dim of x. weight (out, in) and bias (out) start as
/// PyTorch's: U(-1/sqrt(in), 1/sqrt(in)).
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true);
  Tensor forward(const Tensor& x) override;
  /// Draws weight and bias again, as the constructor does.
  void reset_parameters();

  int64_t in_features, out_features;
  Tensor weight, bias;  ///< bias is undefined when constructed with bias = false
};

/// 2-D convolution over x (N, C, H, W), as torch.nn.Conv2d: a kernel of kh x kw, stride and
/// padding (each one int for both dims or {h, w}; the padding zeros or padding_mode's), in `groups`
/// groups of channels (in and out divisible by it; groups = in is a depthwise convolution), with
/// the kernel's taps `dilation` pixels apart. weight (out, in / groups, kh, kw) and bias (out)
/// start as PyTorch's: U(-1/sqrt(fan_in), ..), fan_in = in / groups * kh * kw.
class Conv2d : public Module {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, Size2 kernel_size, Size2 stride = 1,
         Size2 padding = 0, bool bias = true, int64_t groups = 1, Size2 dilation = 1,
         std::string padding_mode = "zeros");
  /// padding kSame: PyTorch's padding="same" (stride 1; an output as large as the input).
  Conv2d(int64_t in_channels, int64_t out_channels, Size2 kernel_size, Size2 stride,
         SamePadding padding, bool bias = true, int64_t groups = 1, Size2 dilation = 1,
         std::string padding_mode = "zeros");
  Tensor forward(const Tensor& x) override;
  void reset_parameters();

  int64_t in_channels, out_channels;
  Size2 kernel_size, stride, padding;
  int64_t groups = 1;
  Size2 dilation = 1;
  /// "zeros", or "reflect", "replicate" or "circular": x padded by pad() in that mode first.
  std::string padding_mode = "zeros";
  bool padding_same = false;  ///< kSame: padding unused, the pads follow from the kernel

  Tensor weight, bias;  ///< bias is undefined when constructed with bias = false

 private:
  Conv2d(int64_t in_channels, int64_t out_channels, Size2 kernel_size, Size2 stride, Size2 padding,
         bool bias, int64_t groups, Size2 dilation, std::string padding_mode, bool same);
};

/// 2-D transposed convolution, as torch.nn.ConvTranspose2d (same argument order; no
/// padding_mode): x (N, in, H, W) -> (N, out, (H - 1) sh - 2 ph + dh (kh - 1) + oph + 1, ...).
/// weight (in, out / groups, kh, kw) and bias (out) start as PyTorch's: U(-1/sqrt(fan_in), ..),
/// fan_in = out / groups * kh * kw.
class ConvTranspose2d : public Module {
 public:
  ConvTranspose2d(int64_t in_channels, int64_t out_channels, Size2 kernel_size, Size2 stride = 1,
                  Size2 padding = 0, Size2 output_padding = 0, int64_t groups = 1, bool bias = true,
                  Size2 dilation = 1);
  Tensor forward(const Tensor& x) override;
  /// The output (oh, ow) rather than the output_padding, as PyTorch's forward(x, output_size):
  /// each between the size of no output padding and that plus stride - 1.
  Tensor forward(const Tensor& x, Size2 output_size);
  void reset_parameters();

  int64_t in_channels, out_channels;
  Size2 kernel_size, stride, padding, output_padding;
  int64_t groups = 1;
  Size2 dilation = 1;
  Tensor weight, bias;  ///< bias is undefined when constructed with bias = false
};

/// 1-D convolution over x (N, C, L), or unbatched (C, L), as torch.nn.Conv1d: conv1d with the
/// stride, padding (zeros, or padding_mode's), groups and dilation of Conv2d along L. weight
/// (out, in / groups, k) and bias (out) start as PyTorch's: U(-1/sqrt(fan_in), ..), fan_in =
/// in / groups * k.
class Conv1d : public Module {
 public:
  Conv1d(int64_t in_channels, int64_t out_channels, int64_t kernel_size, int64_t stride = 1,
         int64_t padding = 0, bool bias = true, int64_t groups = 1, int64_t dilation = 1,
         std::string padding_mode = "zeros");
  /// padding kSame: PyTorch's padding="same" (stride 1; an output as long as the input).
  Conv1d(int64_t in_channels, int64_t out_channels, int64_t kernel_size, int64_t stride,
         SamePadding padding, bool bias = true, int64_t groups = 1, int64_t dilation = 1,
         std::string padding_mode = "zeros");
  Tensor forward(const Tensor& x) override;
  void reset_parameters();

  int64_t in_channels, out_channels, kernel_size, stride, padding;
  int64_t groups = 1, dilation = 1;
  /// "zeros", or "reflect", "replicate" or "circular": x padded by pad() in that mode first.
  std::string padding_mode = "zeros";
  bool padding_same = false;  ///< kSame: padding unused, the pads follow from the kernel
  Tensor weight, bias;        ///< bias is undefined when constructed with bias = false

 private:
  Conv1d(int64_t in_channels, int64_t out_channels, int64_t kernel_size, int64_t stride,
         int64_t padding, bool bias, int64_t groups, int64_t dilation, std::string padding_mode,
         bool same);
};

/// The max over kh x kw windows of x (N, C, H, W), as torch.nn.MaxPool2d (max_pool2d): each
/// size one int for both dims or {h, w}; a stride of 0 is the kernel size.
class MaxPool2d : public Module {
 public:
  explicit MaxPool2d(Size2 kernel_size, Size2 stride = 0, Size2 padding = 0, Size2 dilation = 1,
                     bool ceil_mode = false);
  Tensor forward(const Tensor& x) override;
  Size2 kernel_size, stride, padding, dilation;  ///< stride as resolved: never 0
  bool ceil_mode;
};

/// The mean over kh x kw windows of x (N, C, H, W), as torch.nn.AvgPool2d (avg_pool2d).
class AvgPool2d : public Module {
 public:
  explicit AvgPool2d(Size2 kernel_size, Size2 stride = 0, Size2 padding = 0, bool ceil_mode = false,
                     bool count_include_pad = true, int64_t divisor_override = 0);
  Tensor forward(const Tensor& x) override;
  Size2 kernel_size, stride, padding;  ///< stride as resolved: never 0
  bool ceil_mode, count_include_pad;
  int64_t divisor_override;  ///< above 0: every window's divisor (0: none)
};

/// x (N, C, H, W) averaged into output_size cells, as torch.nn.AdaptiveAvgPool2d
/// (adaptive_avg_pool2d); AdaptiveAvgPool2d(1) is a global average pooling.
class AdaptiveAvgPool2d : public Module {
 public:
  explicit AdaptiveAvgPool2d(Size2 output_size);
  Tensor forward(const Tensor& x) override;
  Size2 output_size;
};

/// The max over adaptive_avg_pool2d's cells, as torch.nn.AdaptiveMaxPool2d (no indices).
class AdaptiveMaxPool2d : public Module {
 public:
  explicit AdaptiveMaxPool2d(Size2 output_size);
  Tensor forward(const Tensor& x) override;
  Size2 output_size;
};

/// max_pool1d over x (N, C, L) or unbatched (C, L), as torch.nn.MaxPool1d; a stride of 0 is the
/// kernel size.
class MaxPool1d : public Module {
 public:
  explicit MaxPool1d(int64_t kernel_size, int64_t stride = 0, int64_t padding = 0,
                     int64_t dilation = 1, bool ceil_mode = false);
  Tensor forward(const Tensor& x) override;
  int64_t kernel_size, stride, padding, dilation;  ///< stride as resolved: never 0
  bool ceil_mode;
};

/// avg_pool1d over x (N, C, L) or unbatched (C, L), as torch.nn.AvgPool1d.
class AvgPool1d : public Module {
 public:
  explicit AvgPool1d(int64_t kernel_size, int64_t stride = 0, int64_t padding = 0,
                     bool ceil_mode = false, bool count_include_pad = true);
  Tensor forward(const Tensor& x) override;
  int64_t kernel_size, stride, padding;  ///< stride as resolved: never 0
  bool ceil_mode, count_include_pad;
};

/// x (N, C, L) averaged into output_size cells, as torch.nn.AdaptiveAvgPool1d.
class AdaptiveAvgPool1d : public Module {
 public:
  explicit AdaptiveAvgPool1d(int64_t output_size);
  Tensor forward(const Tensor& x) override;
  int64_t output_size;
};

/// The max over AdaptiveAvgPool1d's cells, as torch.nn.AdaptiveMaxPool1d (no indices).
class AdaptiveMaxPool1d : public Module {
 public:
  explicit AdaptiveMaxPool1d(int64_t output_size);
  Tensor forward(const Tensor& x) override;
  int64_t output_size;
};

/// x resampled, as torch.nn.Upsample: by scale_factor (upsample(): x (N, C, L), (N, C, H, W) or
/// (N, C, D, H, W)), or to an output size (interpolate(): an image's a Size2, so Upsample(2) is a
/// scale factor and Upsample(Size2(8)) or Upsample({8, 6}) a size; a volume's a Size3,
/// Upsample({4, 8, 6})), in mode "nearest", "nearest-exact", "linear" (sequences), "bilinear" or
/// "bicubic" (images), "trilinear" (volumes) or "area" (align_corners for the interpolating modes
/// only).
class Upsample : public Module {
 public:
  explicit Upsample(double scale_factor, std::string mode = "nearest", bool align_corners = false);
  explicit Upsample(Size2 size, std::string mode = "nearest", bool align_corners = false);
  explicit Upsample(Size3 size, std::string mode = "nearest", bool align_corners = false);
  Tensor forward(const Tensor& x) override;
  double scale_factor = 0;  ///< 0 where the module resizes to a size
  Size2 size = 0;           ///< an image's output size; 0 where it scales or resizes a volume
  Size3 volume_size = 0;    ///< a volume's output size (the Size3 constructor), else 0
  std::string mode;
  bool align_corners;
};

/// A table of num_embeddings vectors of embedding_dim, looked up by i64 indices of any shape
/// (the result has shape indices.shape + (embedding_dim)). weight starts N(0, 1).
class Embedding : public Module {
 public:
  /// padding_idx: the row (negative: counted from the end) that starts as zeros and gets no
  /// gradient, as PyTorch's.
  Embedding(int64_t num_embeddings, int64_t embedding_dim,
            std::optional<int64_t> padding_idx = std::nullopt);
  Tensor forward(const Tensor& indices) override;

  int64_t num_embeddings, embedding_dim;
  std::optional<int64_t> padding_idx;  ///< counted from the start, as PyTorch keeps it
  Tensor weight;
};

/// embedding_bag over its weight (num_embeddings, embedding_dim), as torch.nn.EmbeddingBag:
/// forward(input, offsets, per_sample_weights) sums or averages each bag's rows.
class EmbeddingBag : public Module {
 public:
  /// mode "sum", "mean" or "max"; padding_idx: the row (negative: counted from the end) that starts
  /// as zeros and that bags leave out.
  EmbeddingBag(int64_t num_embeddings, int64_t embedding_dim, std::string mode = "mean",
               bool include_last_offset = false, std::optional<int64_t> padding_idx = std::nullopt);
  using Module::forward;
  using Module::operator();
  /// A 2-D input: each row a bag.
  Tensor forward(const Tensor& input) override;
  Tensor forward(const Tensor& input, const Tensor& offsets, const Tensor& per_sample_weights = {});
  Tensor operator()(const Tensor& input, const Tensor& offsets,
                    const Tensor& per_sample_weights = {}, DUET_HERE) {
    duet::detail::SiteGuard site(loc);
    return forward(input, offsets, per_sample_weights);
  }

  int64_t num_embeddings, embedding_dim;
  std::string mode;
  bool include_last_offset;
  std::optional<int64_t> padding_idx;  ///< counted from the start, as PyTorch keeps it
  Tensor weight;
};

/// Normalizes over the trailing `normalized_shape` dims, then (with elementwise_affine)
/// scales by weight (ones at first) and shifts by bias (zeros at first).
class LayerNorm : public Module {
 public:
  /// bias false: a weight without a bias (PyTorch's bias=False).
  explicit LayerNorm(Shape normalized_shape, double eps = 1e-5, bool elementwise_affine = true,
                     bool bias = true);
  Tensor forward(const Tensor& x) override;

  Shape normalized_shape;
  double eps;
  Tensor weight, bias;  ///< undefined without elementwise_affine (bias: or without bias)
};

/// In training mode, zeroes each element with probability p and scales the rest by 1/(1-p);
/// in evaluation mode, the identity. Masks come from duet's Philox generator, so eager and
/// compiled code draw the same masks under the same manual_seed.
class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5);
  Tensor forward(const Tensor& x) override;
  double p;
};

/// Flattens dims start_dim..end_dim into one: (N, C, H, W) -> (N, C*H*W) by default.
class Flatten : public Module {
 public:
  explicit Flatten(int64_t start_dim = 1, int64_t end_dim = -1);
  Tensor forward(const Tensor& x) override;
  int64_t start_dim, end_dim;
};

/// Returns its input (the same tensor), as torch.nn.Identity.
class Identity : public Module {
 public:
  Identity() : Module("Identity()") {}
  Tensor forward(const Tensor& x) override;
};

/// Elementwise activations.
class ReLU : public Module {
 public:
  ReLU() : Module("ReLU()") {}
  Tensor forward(const Tensor& x) override;
};
class Tanh : public Module {
 public:
  Tanh() : Module("Tanh()") {}
  Tensor forward(const Tensor& x) override;
};
/// x * Phi(x), with the exact erf (PyTorch's default, approximate = "none"), or its tanh form
/// (approximate = "tanh"): see duet::gelu. Another string is a ValueError.
class GELU : public Module {
 public:
  explicit GELU(std::string approximate = "none");
  Tensor forward(const Tensor& x) override;
  std::string approximate;
};
class Sigmoid : public Module {
 public:
  Sigmoid() : Module("Sigmoid()") {}
  Tensor forward(const Tensor& x) override;
};
/// x * sigmoid(x).
class SiLU : public Module {
 public:
  SiLU() : Module("SiLU()") {}
  Tensor forward(const Tensor& x) override;
};

/// log(1 + e^(beta * x)) / beta, linear above the threshold (PyTorch's defaults).
class Softplus : public Module {
 public:
  explicit Softplus(double beta = 1, double threshold = 20);
  Tensor forward(const Tensor& x) override;
  double beta, threshold;
};

/// torch.nn.MultiheadAttention with batch_first=True: query (N, L, E), key and value (N, S, E)
/// give (N, L, E). Parameters as PyTorch names them: in_proj_weight (3E, E), the query, key and
/// value projections stacked, in_proj_bias (3E), and the child out_proj, a Linear(E, E)
/// (out_proj.weight, out_proj.bias); initialized as PyTorch does (xavier_uniform on
/// in_proj_weight, zero biases). Each head attends with scaled_dot_product_attention over
/// head_dim = E / num_heads features.
///
/// attn_mask follows torch.nn.MultiheadAttention, not scaled_dot_product_attention: a b8 mask is
/// true where attending is *not* allowed, a floating mask is added; its shape is (L, S) or
/// (N * num_heads, L, S). is_causal applies the causal mask itself (PyTorch takes it only as a
/// hint beside an explicit mask); it cannot be combined with attn_mask, but joins a
/// key_padding_mask. kdim = vdim = E.
class MultiheadAttention : public Module {
 public:
  /// dropout: the probability of dropping an attention weight in training mode (PyTorch's).
  MultiheadAttention(int64_t embed_dim, int64_t num_heads, bool bias = true, double dropout = 0);
  /// Self-attention without a mask: forward(x, x, x).
  Tensor forward(const Tensor& x) override;
  /// key_padding_mask (N, S): b8 true where a key is padding (not attended to), or floating
  /// (the query's dtype), added to the scores; it combines with attn_mask as PyTorch's does.
  Tensor forward(const Tensor& query, const Tensor& key, const Tensor& value,
                 const Tensor& attn_mask = {}, bool is_causal = false,
                 const Tensor& key_padding_mask = {});
  /// The output and the attention weights (N, L, S), averaged over the heads (PyTorch's
  /// need_weights=True, average_attn_weights=True); in training mode with dropout, the weights
  /// after it, as PyTorch returns them.
  std::pair<Tensor, Tensor> forward_with_weights(const Tensor& query, const Tensor& key,
                                                 const Tensor& value, const Tensor& attn_mask = {},
                                                 bool is_causal = false,
                                                 const Tensor& key_padding_mask = {});
  void reset_parameters();

  int64_t embed_dim, num_heads, head_dim;
  double dropout;                       ///< of the attention weights, in training mode
  Tensor in_proj_weight, in_proj_bias;  ///< in_proj_bias is undefined with bias = false
  Linear out_proj;

 private:
  std::pair<Tensor, Tensor> attend(const Tensor& query, const Tensor& key, const Tensor& value,
                                   const Tensor& attn_mask, bool is_causal,
                                   const Tensor& key_padding_mask, bool weights);
};

/// True for std::shared_ptr to a module class.
template <class T>
inline constexpr bool is_module_ptr = false;
template <ModuleType T>
inline constexpr bool is_module_ptr<std::shared_ptr<T>> = true;

/// A module given by value or by std::shared_ptr (what containers accept).
template <class M>
concept ModuleArg = ModuleType<std::remove_cvref_t<M>> || is_module_ptr<std::remove_cvref_t<M>>;

/// A chain of modules, each applied to the previous one's output; children are named "0",
/// "1", ... Built from modules by value (copies share their state) or std::shared_ptr:
/// `Sequential(Linear(784, 1024), ReLU(), Linear(1024, 10))`. Empty, it is the identity.
class Sequential : public Module {
 public:
  Sequential() : Module("Sequential") {}
  /// The modules in order. One Sequential argument is a copy, not a nesting (as in LibTorch).
  template <class... Ms>
  requires(sizeof...(Ms) > 0 && (ModuleArg<Ms> && ...) &&
           !(sizeof...(Ms) == 1 && (std::is_same_v<std::remove_cvref_t<Ms>, Sequential> &&
                                    ...))) explicit Sequential(Ms&&... modules)
      : Sequential() {
    (push_back(std::forward<Ms>(modules)), ...);
  }

  /// Appends a module under the next index.
  template <ModuleType M>
  void push_back(M module) {
    register_module(std::to_string(size()), std::move(module));
  }
  template <ModuleType M>
  void push_back(std::shared_ptr<M> module) {
    register_module(std::to_string(size()), std::move(module));
  }

  Tensor forward(const Tensor& x) override;
  size_t size() const { return num_children(); }
  /// The i-th module (a ValueError when out of range).
  std::shared_ptr<Module> operator[](size_t i) const;
  /// The i-th module as its concrete type: `seq.at<Linear>(0).weight`. A ValueError when out of
  /// range or of another type.
  template <ModuleType M>
  M& at(size_t i) const {
    auto* m = dynamic_cast<M*>(&child(i));
    DUET_CHECK_VALUE(m, "[Sequential] module {} is {}, not the type asked for", i, child(i).name());
    return *m;
  }
};

/// A list of modules, registered as children "0", "1", ... (torch.nn.ModuleList): it holds
/// modules for its parent's forward and has no forward of its own. Modules go in by value (a
/// copy shares the module's state) or by std::shared_ptr; iteration gives each as a
/// std::shared_ptr<Module>: `for (const auto& m : list) x = m->forward(x);`.
class ModuleList : public Module {
 public:
  /// Iterates the modules in order.
  class Iterator {
   public:
    using iterator_category = std::forward_iterator_tag;
    using value_type = std::shared_ptr<Module>;
    using difference_type = std::ptrdiff_t;
    using pointer = const value_type*;
    using reference = const value_type&;
    Iterator(const ModuleList* list, size_t i) : list_(list), i_(i) {}
    reference operator*() const { return list_->ptr(i_); }
    pointer operator->() const { return &list_->ptr(i_); }
    Iterator& operator++() {
      ++i_;
      return *this;
    }
    Iterator operator++(int) {
      Iterator old = *this;
      ++i_;
      return old;
    }
    bool operator==(const Iterator& o) const { return list_ == o.list_ && i_ == o.i_; }

   private:
    const ModuleList* list_;
    size_t i_;
  };

  ModuleList() : Module("ModuleList") {}
  /// The modules in order. One ModuleList argument is a copy, not a nesting (as in LibTorch).
  template <class... Ms>
  requires(sizeof...(Ms) > 0 && (ModuleArg<Ms> && ...) &&
           !(sizeof...(Ms) == 1 && (std::is_same_v<std::remove_cvref_t<Ms>, ModuleList> &&
                                    ...))) explicit ModuleList(Ms&&... modules)
      : ModuleList() {
    (push_back(std::forward<Ms>(modules)), ...);
  }

  /// Appends a module under the next index.
  template <ModuleType M>
  void push_back(M module) {
    register_module(std::to_string(size()), std::move(module));
  }
  template <ModuleType M>
  void push_back(std::shared_ptr<M> module) {
    register_module(std::to_string(size()), std::move(module));
  }
  /// Appends the modules of `other` (the same modules, shared, not copies).
  void extend(const ModuleList& other);

  size_t size() const { return num_children(); }
  bool is_empty() const { return size() == 0; }
  /// The i-th module (a ValueError when out of range).
  std::shared_ptr<Module> operator[](size_t i) const { return ptr(i); }
  const std::shared_ptr<Module>& ptr(size_t i) const;
  /// The i-th module as its concrete type: `list.at<Linear>(0).weight`. A ValueError when out
  /// of range or of another type.
  template <ModuleType M>
  M& at(size_t i) const {
    auto* m = dynamic_cast<M*>(ptr(i).get());
    DUET_CHECK_VALUE(m, "[ModuleList] module {} is {}, not the type asked for", i, ptr(i)->name());
    return *m;
  }
  Iterator begin() const { return {this, 0}; }
  Iterator end() const { return {this, size()}; }
};

/// Modules by name, in insertion order, each registered as a child under its key
/// (torch.nn.ModuleDict): `dict["encoder"]`, `dict.at<Linear>("head")`. A key must be a
/// valid child name (not empty, no '.') and new: inserting a key already present is a
/// ValueError. Iterate with items(), keys() or values().
class ModuleDict : public Module {
 public:
  using Item = std::pair<std::string, std::shared_ptr<Module>>;
  ModuleDict() : Module("ModuleDict") {}
  /// The modules under their keys, in order.
  explicit ModuleDict(const std::vector<Item>& items);

  /// Registers `module` under `key` and returns it (by value: a copy sharing its state).
  template <ModuleType M>
  M insert(std::string key, M module) {
    return register_module(std::move(key), std::move(module));
  }
  template <ModuleType M>
  std::shared_ptr<M> insert(std::string key, std::shared_ptr<M> module) {
    return register_module(std::move(key), std::move(module));
  }

  size_t size() const { return num_children(); }
  bool is_empty() const { return size() == 0; }
  bool contains(const std::string& key) const { return child_named(key) != nullptr; }
  /// The module under `key` (a ValueError naming the key and the keys there are when absent).
  std::shared_ptr<Module> operator[](const std::string& key) const;
  /// The module under `key` as its concrete type (a ValueError when absent or of another type).
  template <ModuleType M>
  M& at(const std::string& key) const {
    const std::shared_ptr<Module> p = (*this)[key];
    auto* m = dynamic_cast<M*>(p.get());
    DUET_CHECK_VALUE(m, "[ModuleDict] module '{}' is {}, not the type asked for", key, p->name());
    return *m;
  }
  std::vector<std::string> keys() const;
  std::vector<std::shared_ptr<Module>> values() const { return children(); }
  std::vector<Item> items() const { return named_children(); }
};

}  // namespace duet::nn
