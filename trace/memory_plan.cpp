#include "trace/memory_plan.h"
