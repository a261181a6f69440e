// Building ONNX models in tests with ONNX's own protobuf classes (test_onnx_import and
// test_onnx_external): graph inputs and outputs, nodes, initializers, and the model file.
#pragma once

#include <onnx/onnx_pb.h>

#include <fstream>
#include <string>
#include <variant>
#include <vector>

#include "duet.h"
#include "trace/onnx/onnx_proto.h"
#include "util.h"

namespace duet::test::onnx_models {

inline void add_input(onnx::GraphProto& g, const std::string& name, int32_t elem,
                      const std::vector<std::variant<int64_t, std::string>>& dims) {
  onnx::ValueInfoProto* v = g.add_input();
  v->set_name(name);
  auto* t = v->mutable_type()->mutable_tensor_type();
  t->set_elem_type(elem);
  for (const auto& d : dims) {
    auto* dim = t->mutable_shape()->add_dim();
    if (std::holds_alternative<int64_t>(d))
      dim->set_dim_value(std::get<int64_t>(d));
    else
      dim->set_dim_param(std::get<std::string>(d));
  }
}

inline void add_output(onnx::GraphProto& g, const std::string& name, int32_t elem) {
  onnx::ValueInfoProto* v = g.add_output();
  v->set_name(name);
  v->mutable_type()->mutable_tensor_type()->set_elem_type(elem);
}

inline onnx::NodeProto* add_node(onnx::GraphProto& g, const std::string& op,
                                 const std::vector<std::string>& in,
                                 const std::vector<std::string>& out) {
  onnx::NodeProto* n = g.add_node();
  n->set_op_type(op);
  n->set_name(out.at(0));
  for (const auto& i : in) n->add_input(i);
  for (const auto& o : out) n->add_output(o);
  return n;
}

inline void add_int_attr(onnx::NodeProto* n, const std::string& name, int64_t v) {
  onnx::AttributeProto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(v);
}

inline void add_ints_attr(onnx::NodeProto* n, const std::string& name,
                          const std::vector<int64_t>& v) {
  onnx::AttributeProto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INTS);
  for (int64_t x : v) a->add_ints(x);
}

inline onnx::TensorProto* add_initializer(onnx::GraphProto& g, const std::string& name,
                                          const Tensor& t) {
  onnx::TensorProto* p = g.add_initializer();
  detail::onnx_io::tensor_to_proto(t, *p);
  p->set_name(name);
  return p;
}

inline void write_model(onnx::GraphProto g, const std::string& path, int opset = 17) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(opset);
  *m.mutable_graph() = std::move(g);
  std::ofstream f(path, std::ios::binary);
  REQUIRE(m.SerializeToOstream(&f));
}

}  // namespace duet::test::onnx_models
