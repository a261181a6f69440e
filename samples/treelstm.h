// A binary TreeLSTM (Tai et al. 2015) over random binary trees, written one tree at a time as
// per-sample code is: the model of samples/treelstm, of bench B2 and of the Autobatch tests.
// Each tree embeds its sentence's words at once and projects them into a leaf's gates; an inner
// node's gates (and a forget gate per child) come from its children's states; the root's state
// is classified. A tree's class is its first word modulo the number of classes, which the root
// can only learn from the leaves up.
#pragma once

#include <memory>
#include <random>
#include <vector>

#include "duet.h"

namespace duet::treelstm {

struct Tree {
  int64_t word = -1;  ///< a leaf's position among its sentence's words; -1 for an inner node
  std::unique_ptr<Tree> left, right;
};

struct Sample {
  Tensor words, label;  ///< i64, shapes (leaves) and (1)
  std::unique_ptr<Tree> tree;
};

/// A random binary tree over the words lo..hi-1.
inline std::unique_ptr<Tree> random_tree(std::mt19937& g, int lo, int hi) {
  auto t = std::make_unique<Tree>();
  if (hi - lo == 1) {
    t->word = lo;
    return t;
  }
  const int k = lo + 1 + static_cast<int>(g() % static_cast<unsigned>(hi - lo - 1));
  t->left = random_tree(g, lo, k);
  t->right = random_tree(g, k, hi);
  return t;
}

/// n trees of min_leaves..max_leaves leaves over random words of a vocabulary.
inline std::vector<Sample> random_batch(std::mt19937& g, int64_t n, int min_leaves, int max_leaves,
                                        int64_t vocab, int64_t classes) {
  std::vector<Sample> batch;
  for (int64_t i = 0; i < n; ++i) {
    const int leaves =
        min_leaves + static_cast<int>(g() % static_cast<unsigned>(max_leaves - min_leaves + 1));
    std::vector<double> w;
    for (int k = 0; k < leaves; ++k) w.push_back(static_cast<double>(g() % vocab));
    const double label = static_cast<double>(static_cast<int64_t>(w[0]) % classes);
    batch.push_back({tensor(w, Options().dtype(DType::i64)),
                     full({1}, label, Options().dtype(DType::i64)), random_tree(g, 0, leaves)});
  }
  return batch;
}

struct TreeLSTM : nn::Module {
  int64_t h, classes;
  nn::Embedding emb;
  nn::Linear leaf, inner, out;
  TreeLSTM(int64_t vocab, int64_t hidden, int64_t num_classes)
      : Module("TreeLSTM"),
        h(hidden),
        classes(num_classes),
        emb(vocab, hidden),
        leaf(hidden, 3 * hidden),
        inner(2 * hidden, 5 * hidden),
        out(hidden, num_classes) {
    register_module("emb", emb);
    register_module("leaf", leaf);
    register_module("inner", inner);
    register_module("out", out);
  }
  struct State {
    Tensor h, c;
  };
  /// A node's state from its children's (a leaf's from its word's row of xs, the projected
  /// embeddings of its sentence).
  State node(const Tree& t, const Tensor& xs) {
    Tensor iou, fl, fr;
    State a, b;
    if (t.word >= 0) {
      iou = xs[t.word];
    } else {
      a = node(*t.left, xs);
      b = node(*t.right, xs);
      Tensor z = inner(cat({a.h, b.h}, 0));
      iou = z.slice(0, 0, 3 * h);
      fl = sigmoid(z.slice(0, 3 * h, 4 * h));
      fr = sigmoid(z.slice(0, 4 * h, 5 * h));
    }
    Tensor c = sigmoid(iou.slice(0, 0, h)) * tanh(iou.slice(0, 2 * h, 3 * h));
    if (t.word < 0) c = c + fl * a.c + fr * b.c;
    return {sigmoid(iou.slice(0, h, 2 * h)) * tanh(c), c};
  }
  /// The cross-entropy of each tree, summed over the batch, one tree at a time.
  Tensor loss(const std::vector<Sample>& batch) {
    Tensor total;
    for (const Sample& s : batch) {
      Tensor l =
          cross_entropy(out(node(*s.tree, leaf(emb(s.words))).h).reshape({1, classes}), s.label);
      total = total.defined() ? total + l : l;
    }
    return total;
  }
};

}  // namespace duet::treelstm
