// The instantiations compiled into the probe (one file each under inst/); the order is the order of the records.
#include "probe_api.h"

namespace probe {
std::unique_ptr<ConvKernel> make_s8_128x128x128_1x1();
std::unique_ptr<ConvKernel> make_s8_128x64x64_1x1();
std::unique_ptr<ConvKernel> make_s8_res_128x128x128_1x1();
std::unique_ptr<ConvKernel> make_s8_res_128x64x64_1x1();
std::unique_ptr<ConvKernel> make_s8_res_128x128x128_2x1();
std::unique_ptr<ConvKernel> make_f16_128x128x64_1x1();
std::unique_ptr<ConvKernel> make_f16_128x64x64_1x1();
std::unique_ptr<ConvKernel> make_f16_res_128x128x64_1x1();
std::unique_ptr<ConvKernel> make_s8_128x64x64_1x1_s4();
std::unique_ptr<ConvKernel> make_s8_res_128x64x64_1x1_s4();
std::unique_ptr<ConvKernel> make_f16_128x64x64_1x1_s4();
std::unique_ptr<ConvKernel> make_s8_p_128x128x128();
std::unique_ptr<ConvKernel> make_s8_p_res_128x128x128();
std::unique_ptr<ConvKernel> make_s8_p_128x256x64();
std::unique_ptr<ConvKernel> make_f16_p_128x128x64();
std::unique_ptr<ConvKernel> make_f16_p_128x256x64();
std::unique_ptr<ConvKernel> make_s8_p_128x64x64();
std::unique_ptr<ConvKernel> make_s8_pp_128x64x64();
std::unique_ptr<ConvKernel> make_f16_p_128x64x64();
std::unique_ptr<ConvKernel> make_f16_pp_128x64x64();
std::unique_ptr<ConvKernel> make_f16_p_256x128x64();

std::vector<KernelFactory> kernels() {
  return {
      &make_s8_128x128x128_1x1,
      &make_s8_128x64x64_1x1,
      &make_s8_res_128x128x128_1x1,
      &make_s8_res_128x64x64_1x1,
      &make_s8_res_128x128x128_2x1,
      &make_f16_128x128x64_1x1,
      &make_f16_128x64x64_1x1,
      &make_f16_res_128x128x64_1x1,
      &make_s8_128x64x64_1x1_s4,
      &make_s8_res_128x64x64_1x1_s4,
      &make_f16_128x64x64_1x1_s4,
      &make_s8_p_128x128x128,
      &make_s8_p_res_128x128x128,
      &make_s8_p_128x256x64,
      &make_f16_p_128x128x64,
      &make_f16_p_128x256x64,
      &make_s8_p_128x64x64,
      &make_s8_pp_128x64x64,
      &make_f16_p_128x64x64,
      &make_f16_pp_128x64x64,
      &make_f16_p_256x128x64};
}
}  // namespace probe
