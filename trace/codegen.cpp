#include "trace/codegen.h"
