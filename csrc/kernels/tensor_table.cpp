#include "tensor_table.h"

#include <cuda_runtime_api.h>

#include <cstring>
#include <string>

#include "../core/device.h"
#include "../core/error.h"

namespace rn::kernels {
namespace {

size_t round_up(size_t bytes) {
  return (bytes + 15) / 16 * 16;
}

}  // namespace

TensorTable::TensorTable(std::vector<TensorView> entries, int64_t chunk_elements) : entries_(std::move(entries)) {
  device_ = current_device();
  const size_t n = entries_.size();
  std::vector<uint64_t> ptrs(n);
  std::vector<int64_t> numels(n);
  std::vector<int32_t> dtypes(n);
  std::vector<int32_t> chunk_tensor;
  std::vector<int64_t> chunk_start;
  for (size_t i = 0; i < n; ++i) {
    const TensorView& t = entries_[i];
    ptrs[i] = reinterpret_cast<uint64_t>(t.defined() ? t.data : nullptr);
    numels[i] = t.defined() ? t.numel() : 0;
    dtypes[i] = static_cast<int32_t>(t.dtype);
    for (int64_t start = 0; start < numels[i]; start += chunk_elements) {
      chunk_tensor.push_back(static_cast<int32_t>(i));
      chunk_start.push_back(start);
    }
  }
  const size_t count = chunk_tensor.size();
  // Layout: 8-byte arrays first, each section 16-byte aligned.
  const size_t off_ptrs = 0;
  const size_t off_numels = off_ptrs + round_up(n * sizeof(uint64_t));
  const size_t off_start = off_numels + round_up(n * sizeof(int64_t));
  const size_t off_dtypes = off_start + round_up(count * sizeof(int64_t));
  const size_t off_tensor = off_dtypes + round_up(n * sizeof(int32_t));
  const size_t total = off_tensor + round_up(count * sizeof(int32_t));
  std::vector<unsigned char> host(total, 0);
  std::memcpy(host.data() + off_ptrs, ptrs.data(), n * sizeof(uint64_t));
  std::memcpy(host.data() + off_numels, numels.data(), n * sizeof(int64_t));
  if (count) std::memcpy(host.data() + off_start, chunk_start.data(), count * sizeof(int64_t));
  std::memcpy(host.data() + off_dtypes, dtypes.data(), n * sizeof(int32_t));
  if (count) std::memcpy(host.data() + off_tensor, chunk_tensor.data(), count * sizeof(int32_t));

  RN_CUDA_CHECK(cudaMalloc(&buffer_, total));
  const cudaError_t copied = cudaMemcpy(buffer_, host.data(), total, cudaMemcpyHostToDevice);
  if (copied != cudaSuccess) {
    cudaFree(buffer_);
    buffer_ = nullptr;
    RN_CUDA_CHECK(copied);
  }
  auto* base = static_cast<unsigned char*>(buffer_);
  list_.ptrs = reinterpret_cast<const uint64_t*>(base + off_ptrs);
  list_.dtypes = reinterpret_cast<const int32_t*>(base + off_dtypes);
  chunks_.tensor = reinterpret_cast<const int32_t*>(base + off_tensor);
  chunks_.start = reinterpret_cast<const int64_t*>(base + off_start);
  chunks_.numel = reinterpret_cast<const int64_t*>(base + off_numels);
  chunks_.count = static_cast<int64_t>(count);
  chunks_.size = chunk_elements;
}

TensorTable::~TensorTable() {
  // cudaFree waits for work still reading the table. Its status is dropped: at interpreter exit the CUDA
  // runtime may already be unloading, and a destructor cannot act on it anyway.
  if (buffer_) cudaFree(buffer_);
}

bool TensorTable::has_absent() const {
  for (const auto& t : entries_) {
    if (!t.defined()) return true;
  }
  return false;
}

void check_table(const TensorTable& table, const char* name, const TensorTable* reference, const char* reference_name,
                 bool allow_absent) {
  const int device = current_device();
  if (table.device() != device) {
    throw ValueError(std::string(name) + ": TensorList was built on CUDA device " + std::to_string(table.device()) +
                     " but the current device is " + std::to_string(device));
  }
  if (!allow_absent && table.has_absent()) {
    throw ValueError(std::string(name) + ": every entry must be an array (None is allowed only in model_copies)");
  }
  if (!reference) return;
  if (table.size() != reference->size()) {
    throw ValueError(std::string(name) + " has " + std::to_string(table.size()) + " tensors but " + reference_name +
                     " has " + std::to_string(reference->size()));
  }
  for (size_t i = 0; i < table.size(); ++i) {
    const TensorView& t = table.entries()[i];
    const TensorView& r = reference->entries()[i];
    if (t.defined() && r.defined() && t.numel() != r.numel()) {
      throw ValueError(std::string(name) + "[" + std::to_string(i) + "] has " + std::to_string(t.numel()) +
                       " elements " + t.shape_str() + " but " + reference_name + "[" + std::to_string(i) + "] has " +
                       std::to_string(r.numel()) + " " + r.shape_str());
    }
  }
}

void check_table_dtype(const TensorTable& table, const char* name, DType dtype) {
  for (size_t i = 0; i < table.size(); ++i) {
    const TensorView& t = table.entries()[i];
    if (t.defined() && t.dtype != dtype) {
      throw TypeError(std::string(name) + "[" + std::to_string(i) + "]: expected " + dtype_name(dtype) + ", got " +
                      dtype_name(t.dtype));
    }
  }
}

void check_table_writable(const TensorTable& table, const char* name) {
  for (size_t i = 0; i < table.size(); ++i) {
    if (table.entries()[i].read_only) {
      throw ValueError(std::string(name) + "[" + std::to_string(i) + "]: the array is read-only");
    }
  }
}

}  // namespace rn::kernels
