// The device-side table behind resnet_native.multi_tensor.TensorList: for every tensor of a list its pointer,
// element count and dtype, plus the list cut into fixed-size chunks (tensor index, first element) so that one
// kernel launch can spread all tensors of a model over the GPU, one chunk per block at a time.
//
// Built once, at construction, into one small cudaMalloc'ed buffer (construction is setup, not an op; the ops
// that read the table allocate nothing and so can be captured in a CUDA graph). Entries may be absent (None in
// Python): only a list of model copies uses that, for parameters that have no low-precision copy.
#pragma once

#include <cstdint>
#include <vector>

#include "../core/tensor.h"

namespace rn::kernels {

// Elements per chunk: one block's share of a tensor at a time. Small enough that a ResNet-18's 11M parameters make
// thousands of chunks, so every SM holds its full 2048 threads of independent loads: these kernels are bound by
// the loads in flight, and a list of a few hundred chunks would leave most SMs' thread slots empty.
constexpr int64_t kMultiTensorChunk = 4096;

// What a kernel sees of one list.
struct DeviceTensorList {
  const uint64_t* ptrs;   // 0 for an absent entry
  const int32_t* dtypes;  // rn::DType values
};

// What a kernel sees of the chunking of a list (every list of one op has the same sizes).
struct DeviceChunks {
  const int32_t* tensor;  // [count] the tensor each chunk belongs to
  const int64_t* start;   // [count] its first element
  const int64_t* numel;   // [tensors] elements of each tensor
  int64_t count;
  int64_t size;  // elements per chunk (the last chunk of a tensor may be shorter)
};

class TensorTable {
 public:
  // `entries` are validated views (an undefined view is an absent entry); chunk_elements >= 1. Needs the GPU.
  explicit TensorTable(std::vector<TensorView> entries, int64_t chunk_elements = kMultiTensorChunk);
  ~TensorTable();
  TensorTable(const TensorTable&) = delete;
  TensorTable& operator=(const TensorTable&) = delete;

  const std::vector<TensorView>& entries() const { return entries_; }
  size_t size() const { return entries_.size(); }
  int device() const { return device_; }
  bool has_absent() const;
  DeviceTensorList list() const { return list_; }
  DeviceChunks chunks() const { return chunks_; }

 private:
  std::vector<TensorView> entries_;
  int device_ = -1;
  void* buffer_ = nullptr;
  DeviceTensorList list_{};
  DeviceChunks chunks_{};
};

// ValueError (naming `name`) unless the table lives on the current device and, when `reference` is given, has
// as many entries as it with equal element counts; absent entries are allowed only with `allow_absent`.
void check_table(const TensorTable& table, const char* name, const TensorTable* reference, const char* reference_name,
                 bool allow_absent);
// TypeError unless every present entry of `table` has dtype `dtype`.
void check_table_dtype(const TensorTable& table, const char* name, DType dtype);
// ValueError if the op would write an entry its producer marked read-only.
void check_table_writable(const TensorTable& table, const char* name);

}  // namespace rn::kernels
