// duet: a C++20 tensor framework with two faces over one op library.
// Users include this one header and use namespace duet.
#pragma once

#include "core/allocator.h"
#include "core/anomaly.h"
#include "core/profiler.h"
#include "core/dispatch.h"
#include "core/dist.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/tensor.h"
#include "cuda/cuda.h"
#include "eager/autograd.h"
#include "nn/data.h"
#include "nn/init.h"
#include "nn/layers.h"
#include "nn/module.h"
#include "nn/optim/optim.h"
#include "trace/codegen.h"
#include "trace/compile.h"
#include "trace/control_flow.h"
#include "trace/graph.h"
#include "trace/program.h"
