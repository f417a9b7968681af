#include "model/bad.h"
