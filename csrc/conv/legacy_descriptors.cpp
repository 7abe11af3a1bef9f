#include "legacy_descriptors.h"

#include <cfloat>
#include <mutex>
#include <string>
#include <unordered_map>

#include "../core/error.h"

namespace rn::legacy {
namespace {

// Past this many groups the cache is emptied: a program with more distinct conv shapes than this is not
// reusing them, and descriptors are cheap to rebuild.
constexpr size_t kMaxCachedGroups = 1024;

cudnnDataType_t data_type(const ConvParams& p) {
  return cudnn_dtype(storage_dtype(static_cast<Precision>(p.precision)));
}
Layout layout_of(const ConvParams& p) {
  return static_cast<Layout>(p.layout);
}

void set_input_filter_conv(const ConvParams& p, cudnnTensorDescriptor_t x, cudnnFilterDescriptor_t w,
                           cudnnConvolutionDescriptor_t conv) {
  const cudnnDataType_t dtype = data_type(p);
  const cudnnTensorFormat_t format = tensor_format(layout_of(p));
  RN_CUDNN_CHECK(cudnnSetTensor4dDescriptor(x, format, dtype, p.x[0], p.x[1], p.x[2], p.x[3]));
  RN_CUDNN_CHECK(cudnnSetFilter4dDescriptor(w, dtype, format, p.w[0], p.w[1], p.w[2], p.w[3]));
  // fp32 compute for every precision: fp16 is cuDNN's PSEUDO_HALF and bf16 its PSEUDO_BFLOAT16 configuration.
  RN_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(conv, p.pad[0], p.pad[1], p.stride[0], p.stride[1], p.dilation[0],
                                                 p.dilation[1], CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  RN_CUDNN_CHECK(cudnnSetConvolutionGroupCount(conv, p.groups));
}

std::array<int, 4> query_output_dims(cudnnConvolutionDescriptor_t conv, cudnnTensorDescriptor_t x,
                                     cudnnFilterDescriptor_t w) {
  std::array<int, 4> dims{};
  RN_CUDNN_CHECK(cudnnGetConvolution2dForwardOutputDim(conv, x, w, &dims[0], &dims[1], &dims[2], &dims[3]));
  return dims;
}

// The fields a descriptor group depends on (precision, layout, shapes, pad / stride / dilation, groups): the key
// with every field that only selects or limits an algorithm zeroed. Zeroing those (rather than copying the
// geometry) keeps any geometry field added to ConvParams in the group key.
ConvParams geometry_of(const ConvParams& p) {
  ConvParams g = p;
  g.device = 0;
  g.direction = 0;
  g.engine = 0;
  g.epilogue = 0;
  g.deterministic = 0;
  g.algo_mode = 0;
  g.fixed_algo = 0;
  g.workspace_cap = 0;
  return g;
}

struct GroupKey {
  ConvParams geometry;
  int32_t math_type;
  bool operator==(const GroupKey& o) const { return geometry == o.geometry && math_type == o.math_type; }
};

struct GroupKeyHash {
  size_t operator()(const GroupKey& k) const {
    return ConvParamsHash()(k.geometry) * 31u + static_cast<size_t>(k.math_type);
  }
};

struct GroupCache {
  std::mutex mutex;
  std::unordered_map<GroupKey, std::shared_ptr<const ConvDescriptors>, GroupKeyHash> map;
};

GroupCache& group_cache() {
  static GroupCache* cache = new GroupCache();  // Never destroyed: descriptors are left to process teardown.
  return *cache;
}

}  // namespace

ConvDescriptors::ConvDescriptors(const ConvParams& p, cudnnMathType_t math) : math_type(math) {
  set_input_filter_conv(p, x.get(), w.get(), conv.get());
  RN_CUDNN_CHECK(cudnnSetConvolutionMathType(conv.get(), math));
  const std::array<int, 4> dims = query_output_dims(conv.get(), x.get(), w.get());
  for (int i = 0; i < 4; ++i) {
    if (dims[i] != p.y[i]) {
      throw ValueError("convolution key " + p.to_string() + " has an output shape cuDNN disagrees with: (" +
                       std::to_string(dims[0]) + ", " + std::to_string(dims[1]) + ", " + std::to_string(dims[2]) +
                       ", " + std::to_string(dims[3]) + ")");
    }
  }
  const cudnnDataType_t dtype = data_type(p);
  const cudnnTensorFormat_t format = tensor_format(layout_of(p));
  RN_CUDNN_CHECK(cudnnSetTensor4dDescriptor(y.get(), format, dtype, p.y[0], p.y[1], p.y[2], p.y[3]));
  RN_CUDNN_CHECK(cudnnSetTensor4dDescriptor(bias.get(), format, dtype, 1, p.y[1], 1, 1));
  // NaN propagates (a NaN input gives a NaN output, as every other ReLU here) and the clip is unbounded.
  RN_CUDNN_CHECK(cudnnSetActivationDescriptor(relu.get(), CUDNN_ACTIVATION_RELU, CUDNN_PROPAGATE_NAN, DBL_MAX));
  RN_CUDNN_CHECK(cudnnSetActivationDescriptor(identity.get(), CUDNN_ACTIVATION_IDENTITY, CUDNN_PROPAGATE_NAN, DBL_MAX));
}

std::shared_ptr<const ConvDescriptors> descriptors(const ConvParams& params, cudnnMathType_t math_type) {
  GroupKey key{geometry_of(params), static_cast<int32_t>(math_type)};
  GroupCache& cache = group_cache();
  {
    std::lock_guard<std::mutex> lock(cache.mutex);
    auto it = cache.map.find(key);
    if (it != cache.map.end()) return it->second;
  }
  // Built outside the lock: construction calls into cuDNN and may throw.
  auto group = std::make_shared<const ConvDescriptors>(params, math_type);
  std::lock_guard<std::mutex> lock(cache.mutex);
  if (cache.map.size() >= kMaxCachedGroups) cache.map.clear();
  auto inserted = cache.map.emplace(key, group);
  return inserted.first->second;  // Another thread's group when it won the race; ours is then freed.
}

void clear_descriptor_cache() {
  GroupCache& cache = group_cache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  cache.map.clear();
}

size_t descriptor_cache_size() {
  GroupCache& cache = group_cache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  return cache.map.size();
}

const ConvDescriptors& DescriptorGroups::get(cudnnMathType_t math_type) {
  const int index = static_cast<int>(math_type);
  if (index >= 0 && index < kMathTypes) {
    if (!groups_[index]) groups_[index] = descriptors(params_, math_type);
    return *groups_[index];
  }
  for (const auto& group : others_) {
    if (group->math_type == math_type) return *group;
  }
  others_.push_back(descriptors(params_, math_type));  // earlier references stay valid: they point at the groups
  return *others_.back();
}

}  // namespace rn::legacy
