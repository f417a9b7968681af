// api.h — commands as functions, for a host that is not the attnres program
// (the Python module, python/_attnres.cpp).  Each takes the words of its
// command line after the command's name ("--steps", "5", …), reads them with
// the command's own option list (cli/options.h: the same flags, defaults and
// checks, the same one-line Errors) and does what the command does, in this
// process and with one rank.
#pragma once

#include <string>
#include <vector>

#include "train/trainer.h"

namespace attnres {

// `attnres train ARGS`, with the step callback of train/trainer.h; the
// result of the run (empty after --help or --plan-ranks).
TrainResult train_command(const std::vector<std::string>& args, const StepCallback& on_step = nullptr);
// `attnres compare ARGS`; its output directory (results.json, results.md,
// report.html), or "" after --help.
std::string compare_command(const std::vector<std::string>& args);
// What `attnres train --help` and `attnres compare --help` print.
std::string train_help();
std::string compare_help();

}  // namespace attnres
