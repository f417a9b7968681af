// overflow.h — finite weights whose float32 arithmetic overflows: the one
// error eval, routing, generate and the Python module give for non-finite
// logits, loss or routing weights (never a NaN result with exit 0), naming
// the tensor to look at.
#pragma once

#include <string>

#include "model/model.h"

namespace attnres {

// The weight tensor with the largest magnitude and that magnitude: "NAME (|w| up to X)".
std::string largest_weight(Model& model);

// Throws "WHAT: the weights are finite but overflow float32 arithmetic; the
// largest is NAME (|w| up to X)".
[[noreturn]] void fail_overflow(Model& model, const std::string& what);

}  // namespace attnres
