// duet: the generated-C++ tier of fused kernels (kernels/fused.h). Placeholder: filled by the
// codegen work of issue 6.
#pragma once
