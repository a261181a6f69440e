#include "trace/fusion.h"
