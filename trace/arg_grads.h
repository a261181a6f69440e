// duet: the .grad of a compiled function's arguments (Note [Argument gradients] in
// trace/arg_grads.cpp). Internal to trace/compile.cpp.
#pragma once

#include <string>
#include <vector>

#include "trace/compile.h"

namespace duet::detail {

/// args with the .grad of each argument that is a leaf requiring grad and has one appended
/// (FlatArgs::grad_of, labels "arg 0.grad"); false, and `aug` untouched, when there is none.
bool with_arg_grads(const FlatArgs& args, FlatArgs& aug);

/// In a trace: binds each appended .grad input to its argument's traced tensor, and returns
/// the traced arguments the function takes (sym without the appended inputs).
std::vector<Tensor> bind_arg_grads(const FlatArgs& args, const std::vector<Tensor>& sym);

/// At the end of a trace: the arguments whose .grad the function changed (a backward reached
/// them), with the new value of each appended to outs. A non-leaf argument is an error, as
/// its gradient would flow into the graph that made it, outside the trace.
std::vector<size_t> collect_arg_grads(const FlatArgs& args, const std::vector<Tensor>& sym,
                                      const std::string& label, std::vector<Tensor>& outs);

/// After a call: moves the last arg_grads.size() results into the .grad of those arguments,
/// into the existing buffer when there is one (as eager accumulation does), else as a new .grad.
void write_arg_grads(const std::vector<size_t>& arg_grads, const FlatArgs& args,
                     std::vector<Tensor>& outs);

}  // namespace duet::detail
