// commands.h — the subcommands of the `attnres` program, one file each in src/cli/.
// Each takes the arguments after its name and returns the process exit code.
#pragma once

namespace attnres {

int cmd_train(int argc, char** argv);
int cmd_eval(int argc, char** argv);
int cmd_eval_tasks(int argc, char** argv);
int cmd_bench(int argc, char** argv);
int cmd_tokenize(int argc, char** argv);
int cmd_tokenizer_train(int argc, char** argv);
int cmd_prepare(int argc, char** argv);
int cmd_routing(int argc, char** argv);
int cmd_generate(int argc, char** argv);
int cmd_export(int argc, char** argv);
int cmd_compare(int argc, char** argv);
int cmd_report(int argc, char** argv);

}  // namespace attnres
