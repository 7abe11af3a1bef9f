#include "downscale_u8.h"

#include <cmath>

#include "../core/error.h"
#include "../core/launch_config.h"

namespace rn::kernels {
namespace {

__global__ void downscale_kernel(const uint8_t* src, int64_t n, int h, int w, const double* wy, const double* wx,
                                 int size, uint8_t* out) {
  constexpr int c = static_cast<int>(ImagesU8::kChannels);
  const int64_t total = n * size * size * c;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int ch = static_cast<int>(i % c);
    const int x = static_cast<int>((i / c) % size);
    const int row = static_cast<int>((i / (c * size)) % size);
    const int64_t image = i / (static_cast<int64_t>(c) * size * size);
    double sum = 0.0;
    for (int sy = 0; sy < h; ++sy) {  // zero weights skipped: the same terms, in the same order, as the reference
      const double a = wy[row * h + sy];
      if (a == 0.0) continue;
      double line = 0.0;
      for (int sx = 0; sx < w; ++sx) {
        const double b = wx[x * w + sx];
        if (b != 0.0) line += b * static_cast<double>(src[((image * h + sy) * w + sx) * c + ch]);
      }
      sum += a * line;
    }
    out[i] = static_cast<uint8_t>(fmin(fmax(floor(sum + 0.5), 0.0), 255.0));
  }
}

}  // namespace

void downscale_u8(const ImagesU8& images, const double* wy, const double* wx, int size, uint8_t* out,
                  cudaStream_t stream) {
  const int64_t total = images.n * size * size * ImagesU8::kChannels;
  if (total == 0) return;
  downscale_kernel<<<grid_size(total), kThreadsPerBlock, 0, stream>>>(
      images.data, images.n, static_cast<int>(images.height), static_cast<int>(images.width), wy, wx, size, out);
  RN_CUDA_CHECK_LAUNCH();
}

}  // namespace rn::kernels
