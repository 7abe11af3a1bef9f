// The one parser and checker of what the algorithm cache takes from Python: keys (ConvParams' text form) and
// choices (the dicts of algo_cache_insert and of the cache file's entries). Anything save_algorithm_cache cannot
// have written is a ValueError that names the field.
#pragma once

#include <pybind11/pybind11.h>

#include <string>

#include "../conv/conv_params.h"

namespace rn {

// A key parsed and its geometry checked (a convolution's, conv_geometry.h): ValueError naming the field (a parse
// error quotes the key; a geometry error does when `name_key`) otherwise.
ConvParams checked_key(const std::string& key, bool name_key);
// The fields of a checked key, typed: {'dir': 'fwd', 'direction': 'forward', 'dev': 0, 'prec': 'fp16',
// 'layout': 'NHWC', 'engine': 'legacy', 'epi': 'bias+relu', 'det': False, 'mode': 'find', 'fixed': 0,
// 'x': (8, 64, 32, 32), 'w': ..., 'y': ..., 'pad': (1, 1), 'stride': (1, 1), 'dil': (1, 1), 'groups': 1,
// 'ws': None or bytes, 'out': None or the dtype of y}.
pybind11::dict key_fields(const ConvParams& params);
// A choice for `params`, every field checked: engine 'legacy' or 'graph', mode a known one, algo one of the
// direction's legacy algorithms or a graph engine id, math_type a cuDNN math type (0 for graph), workspace within
// the key's cap, time_ms None or a finite duration >= 0, knobs / fused_path / algo_name strings when present.
AlgoChoice checked_choice(const ConvParams& params, pybind11::handle choice);

}  // namespace rn
