#include "util.h"

namespace duet::test {}
