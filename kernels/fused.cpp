#include "kernels/fused.h"
