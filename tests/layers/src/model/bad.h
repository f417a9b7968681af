#include "core/a.h"
#include "train/loop.h"
