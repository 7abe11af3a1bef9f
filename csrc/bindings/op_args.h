// Argument gathering for the bindings of the kernel, batch-norm, pooling and multi-tensor ops, in three phases:
// 1. input() / output() parse each array through tensor_arg() without touching the device (type, dtype, rank,
//    dimensions, C-contiguity, pointer; outputs must be writable). An output given as None gets a view of its
//    shape and dtype but no memory yet.
// 2. The binding checks the relations between arguments (shapes, aliasing); views without memory take part in
//    shape checks and never overlap anything.
// 3. prepare_device() confirms every given array lives on the current GPU, then allocates the missing outputs
//    (output_alloc.h): the op's first device access. So every validation error is raised, naming the argument,
//    even on a machine without a GPU (the CPU tests rely on it), and never as an allocation error.
// object() then gives the Python object of an output, given or allocated, for the binding to return.
#pragma once

#include <pybind11/pybind11.h>

#include <deque>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "../core/tensor.h"
#include "../kernels/scalar_arg.h"
#include "tensor_arg.h"

namespace rn {

class OpArgs {
 public:
  explicit OpArgs(const char* op) : op_(op) {}
  OpArgs(const OpArgs&) = delete;
  OpArgs& operator=(const OpArgs&) = delete;

  const TensorView& input(pybind11::handle obj, const char* name, const DTypeRequest& dtype,
                          TensorArgOptions options = {});
  // None gives an undefined view, which prepare_device() skips.
  const TensorView& optional_input(pybind11::handle obj, const char* name, const DTypeRequest& dtype,
                                   TensorArgOptions options = {});
  // An array the op writes: the given one (writable), or for None a new one of `shape`, allocated by
  // prepare_device(). The shape of a given output is the binding's to check (its messages vary).
  const TensorView& output(pybind11::handle obj, const char* name, DType dtype, const std::vector<int64_t>& shape,
                           TensorArgOptions options = {});
  // An array the op writes when given; None stays undefined (nothing is allocated).
  const TensorView& optional_output(pybind11::handle obj, const char* name, DType dtype, TensorArgOptions options = {});

  // TypeError for host memory, ValueError for another device, NoGPUError without a GPU; then the allocations.
  void prepare_device();
  // After prepare_device(): a new output of `shape` that only the device could size (batch norm's reserve).
  const TensorView& allocate(const char* name, DType dtype, const std::vector<int64_t>& shape);
  // The Python object of `view` (an output given or allocated, or an input); None for an undefined view.
  pybind11::object object(const TensorView& view) const;

  // Settings shown in error messages after the arrays, e.g. "layout=NHWC, relu".
  void set_note(std::string note) { note_ = std::move(note); }
  // OpContext formatter: "add(a=float16(8, 64), b=float16(8, 64), out=float16(8, 64))".
  static std::string describe(const void* self);

 private:
  struct Entry {
    TensorView view;
    const char* name;
    pybind11::object object;  // None until a missing output is allocated
    bool pending = false;     // a missing output: shaped, no memory yet
  };
  Entry& add(TensorView view, const char* name, pybind11::handle obj);
  void fill(Entry& entry);

  const char* op_;
  std::string note_;
  std::deque<Entry> entries_;  // deque: references to views stay valid as it grows
};

// The shape of a view, as output() takes it.
std::vector<int64_t> shape_of(const TensorView& view);
// The options of a 4-D activation argument in `layout`: rank 4 (the error names N, C, H, W in the layout's
// order), every dimension within int (cuDNN's descriptors, nchw_dims).
TensorArgOptions activation_options(Layout layout);

// Whether the byte ranges of two views with memory intersect.
bool overlaps(const TensorView& a, const TensorView& b);
// ValueError unless `out` and `in` are disjoint or exactly the same array (in place).
void check_in_place_or_disjoint(const TensorView& out, const char* out_name, const TensorView& in, const char* in_name);

struct NamedView {
  const TensorView& view;
  const char* name;
};
// ValueError unless `out` is disjoint from each of `inputs` (ops that read an input after writing their output).
void check_disjoint(const TensorView& out, const char* out_name, std::initializer_list<NamedView> inputs);

// Whether a scalar argument is a device array (then parsed as one) rather than a number: it has a
// __cuda_array_interface__, or DLPack naming a CUDA device. Host arrays (NumPy 0-d arrays) are numbers.
bool is_device_array(pybind11::handle obj);
// A number, or a float32 device array of shape (1,) that the kernel reads (a Python float keeps no range check
// here: the caller checks the arguments that have one).
kernels::ScalarArg scalar_arg(OpArgs& args, pybind11::handle obj, const char* name);

// A device array of shape (1,) and `dtype` (found_inf, a step count, the loss scale): None is a TypeError.
const TensorView& one_element_arg(OpArgs& args, pybind11::handle obj, const char* name, DType dtype, bool writable);

}  // namespace rn
