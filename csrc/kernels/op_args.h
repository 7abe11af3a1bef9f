// Argument gathering for the bindings of the kernel, batch-norm, pooling and multi-tensor ops, in two phases:
// array() / optional() parse each argument through tensor_arg() without touching the device (type, dtype, rank,
// emptiness, C-contiguity), the binding then checks the relations between arguments (shapes, aliasing), and
// only then check_on_device() confirms every array lives on the current GPU. So every validation error is
// raised, naming the argument, even on a machine without a GPU (the CPU tests rely on it).
#pragma once

#include <pybind11/pybind11.h>

#include <deque>
#include <string>
#include <utility>

#include "../core/tensor.h"

namespace rn {

class OpArgs {
 public:
  explicit OpArgs(const char* op) : op_(op) {}
  OpArgs(const OpArgs&) = delete;
  OpArgs& operator=(const OpArgs&) = delete;

  const TensorView& array(pybind11::handle obj, const char* name, DType dtype, int ndim = -1);
  // None gives an undefined view, which check_on_device() skips.
  const TensorView& optional(pybind11::handle obj, const char* name, DType dtype, int ndim = -1);
  // TypeError for host memory, ValueError for another device, NoGPUError without a GPU.
  void check_on_device() const;

  // Settings shown in error messages after the arrays, e.g. "layout=NHWC, relu".
  void set_note(std::string note) { note_ = std::move(note); }
  // OpContext formatter: "add(a=float16(8, 64), b=float16(8, 64), out=float16(8, 64))".
  static std::string describe(const void* self);

 private:
  const char* op_;
  std::string note_;
  std::deque<std::pair<TensorView, const char*>> views_;  // deque: references stay valid as it grows
};

// Whether the byte ranges of two defined views intersect.
bool overlaps(const TensorView& a, const TensorView& b);
// ValueError unless `out` and `in` are disjoint or exactly the same array (in place).
void check_in_place_or_disjoint(const TensorView& out, const char* out_name, const TensorView& in, const char* in_name);
// ValueError unless `out` and `in` are disjoint (ops that read an input after writing their output).
void check_disjoint(const TensorView& out, const char* out_name, const TensorView& in, const char* in_name);

}  // namespace rn
