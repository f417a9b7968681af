// presets.h — built-in model configurations, by name (docs/DESIGN.md §5 and the
// default tiny model of the main job).  `load_config` takes a preset name or a
// path to a config.json.
#pragma once

#include <string>
#include <vector>

#include "model/config.h"

namespace attnres {

std::vector<std::string> preset_names();
Config load_config(const std::string& name_or_path);

}  // namespace attnres
